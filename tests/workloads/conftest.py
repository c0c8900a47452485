"""The checks of users' loops and scripts keep an engine per spec for the session; each module's
engines (they grow with the models they ran: conv nets, clusters, other envs' interpreters) are
closed when the module ends, so that the session's memory is one module's, not all of theirs
(engines start again in a fraction of a second from their fork server; a real cluster's is kept)."""

import pytest


@pytest.fixture(autouse=True, scope="module")
def _engines_per_module(request):
    pool = request.getfixturevalue("pool")
    yield
    pool.release_all()
