"""The Hugging Face ``transformers`` vision models the conversion is tested on, each built from a tiny config with
random weights (nothing downloaded): every image-classification family the sweep covers, one semantic-segmentation
and one detection model. ``HF_DEFAULT_SUBSET`` runs by default; the rest with ``pytest -m zoo``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

# Small sizes shared by the transformer families: a 32-px image, 8-px patches, width 16, one layer, two heads.
_VIT = {
    "image_size": 32,
    "patch_size": 8,
    "hidden_size": 16,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 32,
}
# Hierarchical (four-stage) families: widths and depths per stage.
_STAGES2 = {"hidden_sizes": [8, 16], "depths": [1, 1]}


@dataclass(frozen=True)
class HFModel:
    name: str  # the family, as the test ids show it
    config: str  # transformers' config class
    model: str  # transformers' model class
    kwargs: dict[str, Any] = field(default_factory=dict)
    input_size: int = 32
    task: str = "classification"  # or "segmentation", "detection"

    @property
    def id(self) -> str:
        return f"hf:{self.name}"

    def build(self) -> nn.Module:
        import transformers

        torch.manual_seed(0)
        config_class = getattr(transformers, self.config)
        config = config_class(num_labels=3, **self.kwargs)
        return getattr(transformers, self.model)(config)

    def example_input(self, batch: int = 2) -> torch.Tensor:
        g = torch.Generator().manual_seed(1)
        return torch.randn(batch, 3, self.input_size, self.input_size, generator=g)

    def example_labels(self, batch: int = 2) -> Any:
        """What ``labels=`` takes: a class per image (classification), a class per pixel (segmentation), a dict
        of classes and boxes per image (detection)."""
        g = torch.Generator().manual_seed(2)
        if self.task == "segmentation":
            return torch.randint(0, 3, (batch, self.input_size, self.input_size), generator=g)
        if self.task == "detection":
            return [
                {"class_labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])} for _ in range(batch)
            ]
        return torch.randint(0, 3, (batch,), generator=g)


HF_MODELS: list[HFModel] = [
    HFModel("vit", "ViTConfig", "ViTForImageClassification", _VIT),
    HFModel("deit", "DeiTConfig", "DeiTForImageClassification", _VIT),
    HFModel("beit", "BeitConfig", "BeitForImageClassification", {**_VIT, "use_relative_position_bias": True}),
    HFModel("dinov2", "Dinov2Config", "Dinov2ForImageClassification", _VIT),
    HFModel(
        "dinov2_with_registers",
        "Dinov2WithRegistersConfig",
        "Dinov2WithRegistersForImageClassification",
        {**_VIT, "num_register_tokens": 2},
    ),
    HFModel(
        "swin",
        "SwinConfig",
        "SwinForImageClassification",
        {"image_size": 32, "patch_size": 4, "embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4},
    ),
    HFModel(
        "swinv2",
        "Swinv2Config",
        "Swinv2ForImageClassification",
        {"image_size": 32, "patch_size": 4, "embed_dim": 8, "depths": [1, 1], "num_heads": [1, 2], "window_size": 4},
    ),
    HFModel("convnext", "ConvNextConfig", "ConvNextForImageClassification", _STAGES2 | {"num_stages": 2}),
    HFModel("convnextv2", "ConvNextV2Config", "ConvNextV2ForImageClassification", _STAGES2 | {"num_stages": 2}),
    HFModel("resnet", "ResNetConfig", "ResNetForImageClassification", _STAGES2 | {"embedding_size": 8}),
    HFModel(
        "regnet", "RegNetConfig", "RegNetForImageClassification", _STAGES2 | {"embedding_size": 8, "groups_width": 8}
    ),
    HFModel(
        "efficientnet",
        "EfficientNetConfig",
        "EfficientNetForImageClassification",
        {"image_size": 32, "width_coefficient": 0.1, "depth_coefficient": 0.1, "hidden_dim": 128},
    ),
    HFModel(
        "mobilenet_v2",
        "MobileNetV2Config",
        "MobileNetV2ForImageClassification",
        {"image_size": 32, "depth_multiplier": 0.1},
    ),
    HFModel(
        "mobilevit",
        "MobileViTConfig",
        "MobileViTForImageClassification",
        {
            "image_size": 32,
            "hidden_sizes": [16, 16, 16],
            "neck_hidden_sizes": [8, 8, 8, 8, 8, 8, 16],
            "num_attention_heads": 2,
        },
    ),
    HFModel(
        "levit",
        "LevitConfig",
        "LevitForImageClassification",
        {
            "image_size": 32,
            "hidden_sizes": [16, 32],
            "num_attention_heads": [1, 2],
            "depths": [1, 1],
            "key_dim": [8, 8],
            "attention_ratio": [2, 2],
            "mlp_ratio": [2, 2],
            "down_ops": [["Subsample", 8, 1, 2, 2, 2]],
        },
    ),
    HFModel(
        "poolformer",
        "PoolFormerConfig",
        "PoolFormerForImageClassification",
        {
            "hidden_sizes": [8, 16],
            "depths": [1, 1],
            "num_encoder_blocks": 2,
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "padding": [2, 1],
        },
    ),
    HFModel(
        "cvt",
        "CvtConfig",
        "CvtForImageClassification",
        {
            "embed_dim": [8, 16],
            "num_heads": [1, 2],
            "depth": [1, 2],
            "patch_sizes": [7, 3],
            "patch_stride": [4, 2],
            "patch_padding": [2, 1],
            "stride_kv": [2, 2],
            "cls_token": [False, True],
            "mlp_ratio": [2.0, 2.0],
            "attention_drop_rate": [0.0, 0.0],
            "drop_rate": [0.0, 0.0],
            "drop_path_rate": [0.0, 0.1],
            "qkv_bias": [True, True],
            "padding_kv": [1, 1],
            "padding_q": [1, 1],
            "stride_q": [1, 1],
            "kernel_qkv": [3, 3],
            "qkv_projection_method": ["dw_bn", "dw_bn"],
        },
    ),
    HFModel(
        "segformer",
        "SegformerConfig",
        "SegformerForImageClassification",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "num_attention_heads": [1, 2],
            "mlp_ratios": [2, 2],
            "decoder_hidden_size": 16,
        },
    ),
    HFModel(
        "segformer_segmentation",
        "SegformerConfig",
        "SegformerForSemanticSegmentation",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "num_attention_heads": [1, 2],
            "mlp_ratios": [2, 2],
            "decoder_hidden_size": 16,
        },
        task="segmentation",
    ),
    HFModel(
        "pvt_v2",
        "PvtV2Config",
        "PvtV2ForImageClassification",
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [8, 16],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "num_attention_heads": [1, 2],
            "mlp_ratios": [2, 2],
        },
    ),
    HFModel(
        "focalnet",
        "FocalNetConfig",
        "FocalNetForImageClassification",
        {
            "image_size": 32,
            "patch_size": 4,
            "embed_dim": 8,
            "depths": [1, 1],
            "focal_levels": [2, 2],
            "focal_windows": [3, 3],
        },
    ),
    HFModel(
        "hiera",
        "HieraConfig",
        "HieraForImageClassification",
        {
            "image_size": [32, 32],
            "patch_size": [3, 3],
            "patch_stride": [2, 2],
            "patch_padding": [1, 1],
            "embed_dim": 8,
            "num_heads": [1, 2],
            "depths": [1, 1],
            "query_stride": [2, 2],
            "masked_unit_size": [4, 4],
            "masked_unit_attention": [True, False],
            "num_query_pool": 1,
        },
    ),
    HFModel(
        "detr",
        "DetrConfig",
        "DetrForObjectDetection",
        {
            "use_timm_backbone": False,
            "use_pretrained_backbone": False,
            "backbone": None,
            "backbone_config": {
                "model_type": "resnet",
                "embedding_size": 8,
                "hidden_sizes": [8, 16],
                "depths": [1, 1],
                "out_features": ["stage2"],
            },
            "d_model": 16,
            "encoder_layers": 1,
            "decoder_layers": 1,
            "encoder_attention_heads": 2,
            "decoder_attention_heads": 2,
            "encoder_ffn_dim": 32,
            "decoder_ffn_dim": 32,
            "num_queries": 5,
        },
        task="detection",
    ),
]

HF_DEFAULT_SUBSET: set[str] = {"hf:vit", "hf:resnet", "hf:convnext"}
