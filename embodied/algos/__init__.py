"""Reinforcement-learning algorithms, one file each (``XCfg`` dataclass + ``X`` class)."""
