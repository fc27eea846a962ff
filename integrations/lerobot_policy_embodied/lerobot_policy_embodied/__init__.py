"""LeRobot policy types ``embodied`` and ``embodied_residual``: policies exported by
``embodied export RUN --format lerobot``.

Importing this package registers :class:`EmbodiedConfig` under the type name ``embodied`` (a
policy embodied trained, as its artifact) and :class:`EmbodiedResidualConfig` under
``embodied_residual`` (a residual embodied trained on a frozen LeRobot base, the base's own
checkpoint beside it), so ``PreTrainedConfig.from_pretrained`` /
``lerobot.policies.factory.get_policy_class(TYPE)`` find them; LeRobot's scripts import it
themselves (it is an installed ``lerobot_policy_*`` distribution).
"""

from lerobot_policy_embodied.configuration_embodied import EmbodiedConfig
from lerobot_policy_embodied.configuration_residual import EmbodiedResidualConfig
from lerobot_policy_embodied.modeling_embodied import EmbodiedPolicy
from lerobot_policy_embodied.modeling_residual import EmbodiedResidualPolicy
from lerobot_policy_embodied.processor_embodied import make_embodied_pre_post_processors
from lerobot_policy_embodied.processor_residual import make_embodied_residual_pre_post_processors

__all__ = [
    "EmbodiedConfig",
    "EmbodiedPolicy",
    "EmbodiedResidualConfig",
    "EmbodiedResidualPolicy",
    "make_embodied_pre_post_processors",
    "make_embodied_residual_pre_post_processors",
]
