"""tf-distribute-suite (installed: ``tf_distribute_suite``). Three packages, one per side of the
process line (docs/architecture.md):

- ``harness``: runs in the pytest process; never imports TensorFlow.
- ``engine``: runs in engine processes; imports TensorFlow, never ``reference``.
- ``common``: what both sides import (spec grammar, protocol, catalogues, result records);
  neither TensorFlow nor ``reference``.

``check`` and ``report`` are the two commands; ``layout`` knows where everything is.
"""
