"""Known deviation keras3-accuracy-counts-each-update-before-3.4 (see known_deviations.toml).

keras.metrics.Accuracy and BinaryAccuracy updated with rank-1 labels (one label per example,
as a binary classifier's are). Keras 3.0-3.3's accuracy() and binary_accuracy() return
ops.mean(matches, axis=-1): for rank-1 labels the mean over the whole batch, one scalar, which
update_state then counts as one example. So two batches of 3 and 1 examples weigh alike
(documented: "how often predictions equal labels", over the examples), and a batch with no rows
(a replica's empty slice of a short last batch) adds NaN. No strategy is needed to see it.
keras-team/keras PR 19847 (Keras 3.4.0) removed the early mean.
Run: python this_file.py (prints each metric's state and result; exit 1 where they deviate)
"""

import keras
import numpy as np

status = 0
for cls in (keras.metrics.Accuracy, keras.metrics.BinaryAccuracy):
    metric = cls()
    # 3 examples, 1 right; then 1 example, right: 2 of 4 examples are right
    metric.update_state(np.array([1.0, 0.0, 0.0], "float32"), np.array([1.0, 1.0, 1.0], "float32"))
    metric.update_state(np.array([1.0], "float32"), np.array([1.0], "float32"))
    total, count = (float(v.numpy()) for v in metric.variables)
    ok = (total, count) == (2.0, 4.0)
    print(f"Keras {keras.__version__} {cls.__name__}: total={total:.4f} count={count:g} "
          f"result={float(metric.result()):.4f} (expected 2/4 = 0.5){'' if ok else '  DEVIATES'}")
    empty = cls()
    empty.update_state(np.zeros((0,), "float32"), np.zeros((0,), "float32"))
    total, count = (float(v.numpy()) for v in empty.variables)
    print(f"  after a batch with no rows: total={total} count={count:g} (expected 0, 0)")
    status |= not ok or not (total == 0.0 and count == 0.0)
raise SystemExit(int(status))
