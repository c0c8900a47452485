"""What both sides import: the spec grammar, the pipe protocol, the catalogues and the probes'
result records. Plain Python and numpy only: no TensorFlow, no ``reference``."""
