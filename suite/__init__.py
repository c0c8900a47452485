"""tf-distribute-suite. Three packages, one per side of the process line (docs/architecture.md):

- ``suite.harness``: runs in the pytest process; never imports TensorFlow.
- ``suite.engine``: runs in engine processes; imports TensorFlow, never ``reference``.
- ``suite.common``: what both sides import (spec grammar, protocol, catalogues, result records);
  neither TensorFlow nor ``reference``.
"""
