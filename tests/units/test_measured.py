"""The version matrix as users ran it: the as-shipped pairings of tox.ini and the code agree,
and every known deviation's declared range agrees with the runs measured on the matrix
(docs/measured_runs.json, written by ``python -m suite.report RESULTS --record``)."""

from __future__ import annotations

import configparser

from suite.harness.judging import deviations
from suite.harness.judging.judgment import Check
from suite.harness.pool.versions import AS_SHIPPED, as_shipped
from suite.harness.reporting import measured
from tests.helpers import ROOT

ENTRIES = deviations.load()


def _tox() -> configparser.ConfigParser:
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "tox.ini")
    return ini


def _as_shipped_envs() -> list[str]:
    labels = dict(line.split("=", 1) for line in _tox()["tox"]["labels"].strip().splitlines())
    return [e.strip() for e in labels["as-shipped "].split(",")]


def _pins() -> dict[str, str]:
    """factor -> pinned version (``tf217: tensorflow-cpu==2.17.1``, ``keras34: keras==3.4.1``)."""
    out = {}
    for line in _tox()["testenv"]["deps"].strip().splitlines():
        factor, _, dep = line.partition(":")
        if "==" in dep and "," not in factor and "-" not in factor:
            out[factor.strip()] = dep.split("==")[1].strip()
    return out


def test_the_as_shipped_envs_are_the_pairings_the_report_names():
    """tox.ini's as-shipped label pins, for each TensorFlow minor 2.16-2.21, the Keras minor that
    versions.AS_SHIPPED gives it (the report's "as shipped" columns), and the envlist runs them."""
    pins, check = _pins(), Check("tox.ini")
    pairs = {}
    for env in _as_shipped_envs():
        tf_factor, keras_factor = env.split("-")
        pairs[".".join(pins[tf_factor].split(".")[:2])] = ".".join(pins[keras_factor].split(".")[:2])
        check.that(as_shipped(pins[tf_factor], pins[keras_factor]), f"env {env}", (pins[tf_factor], pins[keras_factor]),
                   "a pairing of versions.AS_SHIPPED")
    check.equal(pairs, AS_SHIPPED, "the as-shipped pairings (TF minor -> Keras minor)")
    envlist = _tox()["tox"]["envlist"]
    check.equal([e for e in _as_shipped_envs() if e not in envlist], [], "as-shipped envs missing from the envlist")


def test_every_declared_range_agrees_with_the_measured_runs():
    """No entry is declared for versions where a ci-profile run ran its tests and never showed it,
    and none was observed outside its declared versions."""
    runs = measured.load()
    Check("docs/measured_runs.json").that(bool(runs), "measured runs", runs, "some runs")
    found = measured.disagreements(ENTRIES, runs)
    Check("known_deviations.toml").equal(found, [], "ranges that disagree with the measured runs")


def _entry(keras: str) -> deviations.Deviation:
    return deviations.Deviation("x", ("tests/t.py::test_f[*]",), ">=2.16", keras, "s", (), "now")


def _run(keras: str, ran: int, observed: int, profile: str = "ci") -> dict:
    return {"tensorflow": "2.17.1", "keras": keras, "profile": profile, "command": "pytest", "items": {},
            "deviations": {"x": {"ran": ran, "observed": observed}}}


def test_a_range_wider_or_narrower_than_measured_is_caught():
    """The judgment itself: an entry declared for a version whose ci run ran its tests without
    showing it, or observed outside its range, is named; a run that did not exercise it (none of
    its tests ran, or a quick run: four examples on two specs) says nothing."""
    check = Check("measured.disagreements")
    runs = [_run("3.4.1", 5, 5), _run("3.5.0", 5, 0)]
    check.equal(measured.disagreements([_entry(">=3.0,<3.5")], runs), [], "a range that fits")
    wide = measured.disagreements([_entry(">=3.0")], runs)
    check.that(len(wide) == 1 and "3.5.0" in wide[0] and "none showed it" in wide[0], "a range too wide", wide,
               "one line naming Keras 3.5.0")
    narrow = measured.disagreements([_entry(">=3.5")], runs)
    check.that(any("observed in TF 2.17.1 / Keras 3.4.1" in line for line in narrow), "a range too narrow", narrow,
               "a line naming the run outside the range that observed it")
    check.equal(measured.disagreements([_entry(">=3.0")], [_run("3.5.0", 0, 0), _run("3.5.0", 5, 0, "quick")]), [],
                "runs that did not exercise the entry")
