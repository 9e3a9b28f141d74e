"""cory: CORY (Coevolving with the Other You, arXiv 2410.06101) and its PPO baseline."""

from cory.naming import register_resolvers

register_resolvers()  # the run-folder resolvers `cory/conf/train.yaml` uses, available wherever `cory` is imported

__version__ = "0.1.0"
