"""tfdistx: declarative, config-driven distributed TensorFlow training."""

__version__ = "0.1.0"
