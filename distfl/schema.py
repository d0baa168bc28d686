"""Old import path of `distfl.config.schema` (the config's dataclasses), kept for code that imports it."""
from distfl.config.schema import (FEATURE_DIM_MODELS, KEYS, NUM_CLASSES, SECTIONS, AggregationConfig, AlgorithmConfig,
                                  CalibrationConfig, CheckpointConfig, Config, DataConfig, EvalConfig, ModelConfig,
                                  OutputConfig, PartitionConfig, PrivacyConfig, RuntimeConfig, ServerConfig, TCTConfig,
                                  TrainConfig)

__all__ = ["FEATURE_DIM_MODELS", "KEYS", "NUM_CLASSES", "SECTIONS", "AggregationConfig", "AlgorithmConfig",
           "CalibrationConfig", "CheckpointConfig", "Config", "DataConfig", "EvalConfig", "ModelConfig", "OutputConfig",
           "PartitionConfig", "PrivacyConfig", "RuntimeConfig", "ServerConfig", "TCTConfig", "TrainConfig"]
