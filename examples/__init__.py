"""Workloads in the suite's protocol (suite/engine/workload.py): the custom-training guide's loop
done right (``examples.guide``) and one loop per mistake the check diagnoses
(``examples.mistakes``). Check one with ``python -m suite.check examples.guide:workload``."""
