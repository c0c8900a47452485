"""Known deviation keras3-gradient-accumulation-counts-every-call-before-3.5 (see known_deviations.toml).

An optimizer with gradient_accumulation_steps=2, called twice in a tf.function step with no
strategy: the first call accumulates, the second applies the mean of the two gradients. Keras
3.0-3.4 count both calls in optimizer.iterations (2 after one applied step), so a schedule or an
Adam bias correction that reads iterations sees the micro-steps; keras-team/keras PR 19998
(Keras 3.5.0) counts the applied steps only (1).
Run: python this_file.py (prints iterations after each call; exit 1 where a call that applied
nothing was counted)
"""

import keras
import numpy as np
import tensorflow as tf

weight = keras.Variable(np.ones(2, "float32"))
optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)


@tf.function
def step():
    optimizer.apply_gradients([(tf.ones(2), weight)])


counts = []
for call in (1, 2):
    step()
    counts.append(int(optimizer.iterations.numpy()))
    print(f"Keras {keras.__version__}: after call {call} of 2 (applied: {call == 2}): iterations "
          f"{counts[-1]}, weight {weight.numpy()}")
print("expected iterations 0 then 1 (the applied steps)")
raise SystemExit(int(counts != [0, 1]))
