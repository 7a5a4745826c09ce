"""The strategies layer, above engines: the pure reader strategies (`strategies.readers`) and retrievers
(`strategies.retrievers`), each registered in its package's registry. The spec (schemas/spec.py) validates names
and settings against these registries; the stages (tasks/) run them."""
