"""Training configuration: one typed, frozen dataclass whose fields are the CLI flags.

Resolution order (later wins): field defaults < the presets (the env family's, the algorithm's,
the algorithm's for the family: see ``preset_files``) < ``--config FILE.yaml`` < the Python API's
settings < flags on the command line (``resolve``). ``RUN_DIR/config.yaml`` holds the result, and
``--resume`` starts from it.

- ``settings``: the fields by concern (run, runtime, actors, env, model, loss, IMPACT, PPO,
  optimiser, logging, faults), each with its bound, combined into ``TrainConfig``;
- ``checks``: the bounds in one loop, the checks across fields, and the settings a run does not read;
- ``files``: presets and YAML, typed like the flags;
- ``resolve``: the layers in that order, for ``impactrl.train`` and ``impactrl train``;
- ``renamed``: the old names of renamed settings (batch_size, queue_slots, target_update_interval),
  still taken with a warning.
"""

from impactrl.config.checks import (ATARI_SETTINGS, OPTIMIZER_SETTINGS, READ_ONLY_BY, RMSPROP_SETTINGS, bound_problems,
                                    envs_split_for_learners, learner_resources, problems, ray_actor_resources, ray_problems,
                                    unread_settings)
from impactrl.config.files import (PRESET_DIR, NumbersLoader, coerce, field_names, integer_settings, load_yaml,
                                   preset_files, preset_values, to_yaml, type_problem, with_values)
from impactrl.config.renamed import RENAMED, renamed_flags, renamed_settings
from impactrl.config.settings import (ActorSettings, EnvBackend, EnvSettings, FaultSettings, ImpactSettings, LoggingSettings,
                                      LossSettings, ModelSettings, OptimizerSettings, PPOSettings, RunSettings,
                                      RuntimeSettings, TrainConfig)

__all__ = ["TrainConfig", "EnvBackend", "RunSettings", "RuntimeSettings", "ActorSettings", "EnvSettings", "ModelSettings",
           "LossSettings", "ImpactSettings", "PPOSettings", "OptimizerSettings", "LoggingSettings", "FaultSettings",
           "problems", "bound_problems", "ray_problems", "ray_actor_resources", "learner_resources", "unread_settings",
           "READ_ONLY_BY", "envs_split_for_learners",
           "ATARI_SETTINGS", "RMSPROP_SETTINGS", "OPTIMIZER_SETTINGS", "PRESET_DIR", "preset_files", "preset_values",
           "field_names", "integer_settings", "type_problem", "coerce", "NumbersLoader", "load_yaml", "to_yaml", "with_values",
           "RENAMED", "renamed_flags", "renamed_settings"]
