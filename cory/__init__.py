"""cory: CORY (Coevolving with the Other You, arXiv 2410.06101) and its PPO baseline."""

__version__ = "0.1.0"
