"""timm families (CNNs, hybrids, vision transformers), random weights, small configs.

`timm` is a dev dependency, imported inside the factories (the zoo package itself needs
torch only). Every model is built with `pretrained=False` (nothing downloads) and shrunk
through timm's own constructor arguments (image size, depth, width) so a conversion takes
seconds; the architecture's op patterns (windowed attention with shifted masks,
relative-position tables, class attention, cross-covariance attention, multi-scale
branches...) stay.
"""

from __future__ import annotations

from .registry import zoo_model


def timm_model(name: str, **kwargs):
    """timm.create_model(name, pretrained=False, **kwargs) in eval mode."""
    from ._timm_compat import import_timm

    return import_timm().create_model(name, pretrained=False, **kwargs).eval()


SMALL = [(1, 3, 64, 64)]
VIT_SMALL = dict(img_size=64, depth=2, embed_dim=64, num_heads=2, num_classes=10)


# ---- CNNs ---------------------------------------------------------------------------------


@zoo_model("timm_resnet18d", SMALL, "cnn")
def timm_resnet18d():
    """timm ResNet-18-D: deep stem (three 3x3 convs), average-pool shortcut downsampling."""
    return timm_model("resnet18d", num_classes=10)


@zoo_model("timm_resnet10t", SMALL, "cnn")
def timm_resnet10t():
    """timm ResNet-10-T: tiered deep stem, the smallest ResNet variant."""
    return timm_model("resnet10t", num_classes=10)


@zoo_model("timm_seresnext26t", SMALL, "cnn")
def timm_seresnext26t():
    """timm SE-ResNeXt-26-T: grouped bottlenecks with squeeze-and-excitation."""
    return timm_model("seresnext26t_32x4d", num_classes=10)


@zoo_model("timm_mixnet_s", SMALL, "cnn")
def timm_mixnet_s():
    """timm MixNet-S: mixed depthwise kernel sizes (split channels, concat)."""
    return timm_model("mixnet_s", num_classes=10)


@zoo_model("timm_rexnet_100", SMALL, "cnn")
def timm_rexnet_100():
    """timm ReXNet-1.0: channel-expanding inverted residuals with partial skip adds."""
    return timm_model("rexnet_100", num_classes=10)


@zoo_model("timm_convnext_atto", SMALL, "cnn")
def timm_convnext_atto():
    """timm ConvNeXt-Atto: 7x7 depthwise, channels-last LayerNorm, layer scale."""
    return timm_model("convnext_atto", num_classes=10)


@zoo_model("timm_regnetx_002", SMALL, "cnn")
def timm_regnetx_002():
    """timm RegNetX-200MF: grouped 3x3 bottlenecks without SE."""
    return timm_model("regnetx_002", num_classes=10)


@zoo_model("timm_dla34", SMALL, "cnn")
def timm_dla34():
    """timm DLA-34: deep layer aggregation trees (many concat + conv merge nodes)."""
    return timm_model("dla34", num_classes=10)


@zoo_model("timm_hrnet_w18_small", SMALL, "cnn")
def timm_hrnet_w18_small():
    """timm HRNet-W18-small: parallel multi-resolution branches fused by upsample-and-add."""
    return timm_model("hrnet_w18_small", num_classes=10)


@zoo_model("timm_repvgg_a0", SMALL, "cnn")
def timm_repvgg_a0():
    """timm RepVGG-A0: 3x3 + 1x1 + identity branches (training-time form)."""
    return timm_model("repvgg_a0", num_classes=10)


@zoo_model("timm_poolformer_s12", SMALL, "cnn")
def timm_poolformer_s12():
    """timm PoolFormer-S12 (MetaFormer): average-pool token mixer, GroupNorm."""
    return timm_model("poolformer_s12", num_classes=10)


# ---- hybrids ------------------------------------------------------------------------------


@zoo_model("timm_mobilevit_xxs", SMALL, "vit")
def timm_mobilevit_xxs():
    """timm MobileViT-XXS: convolutions plus transformers over unfolded patches."""
    return timm_model("mobilevit_xxs", num_classes=10)


@zoo_model("timm_efficientformer_l1", [(1, 3, 224, 224)], "vit")
def timm_efficientformer_l1():
    """timm EfficientFormer-L1 (its attention bias table fixes the input at 224x224): pooling
    mixers, then attention with a learned bias table."""
    return timm_model("efficientformer_l1", num_classes=10)


@zoo_model("timm_levit_128s", SMALL, "vit")
def timm_levit_128s():
    """timm LeViT-128S: conv stem, attention with relative-position bias gathered by index, hard-swish."""
    return timm_model("levit_128s", img_size=64, num_classes=10)


@zoo_model("timm_convit_tiny", SMALL, "vit")
def timm_convit_tiny():
    """timm ConViT-Tiny: gated positional self-attention (relative-position maps built in forward)."""
    return timm_model("convit_tiny", **VIT_SMALL, local_up_to_layer=1)


@zoo_model("timm_pvt_v2_b0", SMALL, "vit")
def timm_pvt_v2_b0():
    """timm PVT-v2-B0: spatial-reduction attention, overlapping patch embeddings, depthwise MLP."""
    return timm_model("pvt_v2_b0", num_classes=10)


@zoo_model("timm_coat_lite_tiny", SMALL, "vit")
def timm_coat_lite_tiny():
    """timm CoaT-Lite-Tiny: factorized attention with convolutional relative position encoding."""
    return timm_model("coat_lite_tiny", img_size=64, num_classes=10)


# ---- vision transformers ------------------------------------------------------------------


@zoo_model("timm_deit_tiny", SMALL, "vit")
def timm_deit_tiny():
    """timm DeiT-Tiny (distilled): class and distillation tokens, two heads averaged."""
    return timm_model("deit_tiny_distilled_patch16_224", **VIT_SMALL)


@zoo_model("timm_vit_reg", SMALL, "vit")
def timm_vit_reg():
    """timm ViT with register tokens and a global-average-pool head."""
    return timm_model("vit_small_patch16_224", **VIT_SMALL, reg_tokens=4, global_pool="avg")


@zoo_model("timm_swin", SMALL, "vit")
def timm_swin():
    """timm Swin: shifted-window attention (window masks and relative-position index built in forward)."""
    return timm_model(
        "swin_tiny_patch4_window7_224",
        img_size=64,
        window_size=4,
        depths=(2, 2),
        num_heads=(2, 4),
        embed_dim=32,
        num_classes=10,
    )


@zoo_model("timm_swinv2", SMALL, "vit")
def timm_swinv2():
    """timm Swin-V2: cosine attention with a log-spaced continuous relative-position MLP."""
    return timm_model(
        "swinv2_tiny_window8_256",
        img_size=64,
        window_size=4,
        depths=(2, 2),
        num_heads=(2, 4),
        embed_dim=32,
        num_classes=10,
    )


@zoo_model("timm_beit", SMALL, "vit")
def timm_beit():
    """timm BEiT: relative-position bias table indexed by a table built in forward, layer scale."""
    return timm_model("beit_base_patch16_224", **VIT_SMALL, use_rel_pos_bias=True)


@zoo_model("timm_cait", SMALL, "vit")
def timm_cait():
    """timm CaiT: talking-heads attention, then class-attention layers."""
    return timm_model("cait_xxs24_224", **VIT_SMALL, depth_token_only=1)


@zoo_model("timm_xcit", SMALL, "vit")
def timm_xcit():
    """timm XCiT: cross-covariance attention (over channels), local patch interaction, Fourier positions."""
    return timm_model(
        "xcit_nano_12_p16_224", img_size=64, depth=2, embed_dim=64, num_heads=2, cls_attn_layers=1, num_classes=10
    )


@zoo_model("timm_crossvit", [(1, 3, 32, 32)], "vit")
def timm_crossvit():
    """timm CrossViT (small config): two patch sizes, class-token cross-attention; its file
    once failed to prepare in LiteRT (a RESHAPE fed a TRANSPOSE's perm after the layout pass's undo)."""
    from ._timm_compat import import_timm

    crossvit = import_timm().models.crossvit
    return crossvit.CrossVit(
        img_size=32,
        img_scale=(1.0, 0.75),
        patch_size=(8, 12),
        embed_dim=(48, 96),
        depth=((1, 4, 0),) * 3,
        num_heads=(3, 3),
        mlp_ratio=(2.0, 2.0, 1.0),
        num_classes=10,
    ).eval()


@zoo_model("timm_eva", [(1, 3, 56, 56)], "vit")
def timm_eva():
    """timm EVA-02: rotary position embedding in 2-D, SwiGLU MLP."""
    return timm_model("eva02_tiny_patch14_224", img_size=56, depth=2, embed_dim=64, num_heads=2, num_classes=10)


@zoo_model("timm_maxvit", SMALL, "vit")
def timm_maxvit():
    """timm MaxViT: MBConv, then block (window) and grid attention with relative-position bias."""
    return timm_model("maxvit_tiny_tf_224", img_size=64, embed_dim=(32, 64), depths=(1, 1), num_classes=10)
