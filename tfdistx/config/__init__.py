"""Everything about the composed config that needs no TensorFlow: the schema,
topology names, validation and where the config tree lives."""
