"""FedST's segmentation network: PVT-v2 encoder, RSC temporal module, textual channel
selection and FedDP's FPN decoder (or a light attention decoder) (``net.FedSTNet``, built
from a config dict)."""

from fedmedbench.models.fedst.net import FedSTNet, ModelConfig, build_fedst_net, dropout_generator

__all__ = ["FedSTNet", "ModelConfig", "build_fedst_net", "dropout_generator"]
