"""LeRobot policy type ``embodied``: a policy exported by ``embodied export RUN --format lerobot``.

Importing this package registers :class:`EmbodiedConfig` under the type name ``embodied``, so
``PreTrainedConfig.from_pretrained`` / ``lerobot.policies.factory.get_policy_class("embodied")``
find it; LeRobot's scripts import it themselves (it is an installed ``lerobot_policy_*``
distribution).
"""

from lerobot_policy_embodied.configuration_embodied import EmbodiedConfig
from lerobot_policy_embodied.modeling_embodied import EmbodiedPolicy
from lerobot_policy_embodied.processor_embodied import make_embodied_pre_post_processors

__all__ = ["EmbodiedConfig", "EmbodiedPolicy", "make_embodied_pre_post_processors"]
