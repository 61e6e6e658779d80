"""FedST's segmentation network: PVT-v2 encoder, RSC temporal module, textual channel
selection and a light attention decoder (``net.FedSTNet``, built from a config dict)."""

from fedmedbench.models.fedst.net import FedSTNet, ModelConfig, build_fedst_net

__all__ = ["FedSTNet", "ModelConfig", "build_fedst_net"]
