"""A user's training script run unchanged in an engine (engine side): the script's strategy
constructors give the spec's strategy, its distributed datasets mark the step boundaries, and
every variable it creates is recorded, so that suite/engine/probes/script.py can report the run
as a workload run is reported.

The run is watched by one ``Watcher`` (watcher.py), made of a part per concern, each in a module of its own:
constructors.py (the strategy constructors the script calls), coordination.py (a parameter-server script's
``ClusterCoordinator``), fit.py (``Model.fit`` and ``evaluate``), variables.py, reported.py (``reduce`` and
local results), datasets.py (what is distributed, shuffled, sharded), boundaries.py (the steps, their
boundaries and the stop);
isolation.py runs the script as in a process of its own, errors.py holds what ends or refuses a run.

How a run is watched (docs/check.md, "A training script"):

* **Strategies.** ``tf.distribute.MirroredStrategy``, ``OneDeviceStrategy``,
  ``MultiWorkerMirroredStrategy`` and ``experimental.CentralStorageStrategy`` (and their
  ``experimental`` names; ``get_strategy()`` called by the script outside a scope where it builds
  none) are replaced, for the run, by subclasses of the real classes whose
  construction returns the strategy the run checks: the spec's own, or for the reference a
  ``Reference``: one device's strategy that tells the script the spec's ``num_replicas_in_sync``
  (so it computes the same global batch) and forwards everything else. ``isinstance`` with the
  replaced names still answers for the real classes. The arguments the script passed are kept
  for the report.
* **Parameter servers.** A script that builds a ``ParameterServerStrategy`` gets the spec's (on a
  parameter-server spec's cluster) or the reference's, and its ``ClusterCoordinator`` is a
  ``_Coordinator``: each ``schedule`` is a step, joined before it returns; the reference runs each
  closure at once on the iterator of the worker the spec's run recorded for it. A script of the
  other kind than the run's spec raises ``WrongKind`` at its constructor.
* **Step boundaries.** What the checked strategy's ``experimental_distribute_dataset`` and
  ``distribute_datasets_from_function`` return is marked; each element drawn eagerly from it
  (``for``, ``next``, ``get_next``) ends the step before it. A script that draws no element
  eagerly but hands an iterator to a ``tf.function`` that calls ``strategy.run`` (``next(iterator)``
  inside it, as TensorFlow's multi-worker tutorial does) is stepped by its calls instead: each call
  of such a function from the script's code is one step, and the first step's boundary is read
  when that function's trace reaches ``strategy.run`` (lifted out of the trace). The run stops, by
  raising ``Stop``, at the boundary after the last compared step.
* **Variables.** A variable creator scope around the run, and one inside the checked strategy's
  ``scope()`` (so that a distributed variable is recorded whole, not its per-device parts),
  record every variable in creation order; at each boundary every one is read on every local
  replica.
* **Reported values.** ``strategy.reduce`` records what it returned (and each replica's value
  it reduced) in every step, eagerly or, inside a ``tf.function``, through a ``py_function``.
"""

from .errors import ScriptError, Stop, Unsupported, WrongKind
from .fit import flat_metrics, mean_state, replica_states
from .isolation import execute, isolated
from .watcher import Watcher

__all__ = ["ScriptError", "Stop", "Unsupported", "Watcher", "WrongKind", "execute", "flat_metrics", "isolated",
           "mean_state", "replica_states"]
