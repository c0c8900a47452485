"""Results on disk (one folder per TensorFlow/Keras) and the reports made from them."""
