"""Every key of a HEAL / GenComm-reference ("hypes") yaml the importer knows, and what it does with it.

A key path is dotted; ``<m>`` stands for a modality name (``m1``, ``m2``, ...);
lists are leaves. Each known path has one rule of :mod:`.hypes_rules` (Mapped,
Approx, Fixed, Dropped, Same, Refused: what each does is said there).

A key not in :data:`KEYS` is accepted with a warning (``not read by this
project``): for the model families converted here (:data:`MODELS`) every key
their model, dataset and loss read is in the table (read from
``models/heter_model_baseline*.py``, the heterogeneous datasets and the losses),
so an unknown key is one the reference does not read either; a key that does
change the computation is listed, as :class:`Refused` or :class:`Fixed`.
:data:`Dropped` keys warn the same way, with their reason. Facts are from the
public HEAL and GenComm code (``opencood/hypes_yaml``, ``models``,
``data_utils``, ``loss``); see docs/interop.md.
"""
from __future__ import annotations

import math
import re
from typing import Dict, Optional, Tuple

from .hypes_rules import Approx, Dropped, Fixed, Mapped, Refused, Rule, Same, compile_pattern


# core_method names of the reference -> our registry names
ENCODERS: Dict[str, str] = {"point_pillar": "pointpillars", "second": "second", "lift_splat_shoot": "lss_reference"}
SENSORS: Dict[str, str] = {"point_pillar": "lidar", "second": "lidar", "lift_splat_shoot": "camera"}
MODELS: Dict[str, str] = {  # reference model -> our intermediate-fusion link
    "heter_model_baseline": "full_feature",
    "heter_pyramid_collab": "full_feature",  # fusion: pyramid (hypes_pyramid.py)
    "heter_model_baseline_w_gencomm_stage1": "gencomm",
    "heter_model_baseline_w_gencomm_stage2": "gencomm",
    "heter_model_baseline_w_stamp": "stamp",  # STAMP's adapter stage: the GenComm reference's m0<m> files
    "collab_w_adapter": "stamp_collab",  # STAMP's own repository: the ego type's model (hypes_stamp.py)
    "heter_model_baseline_w_stamp_infer": "stamp_collab",  # the GenComm reference's STAMP inference
}
# reference models whose structure has no counterpart here: why, in one line
_STAMP_REPO = ("STAMP's every-agent inference variant (each agent fuses with its own type's model and gets its "
               "own output); the ego's output is collab_w_adapter's, which converts: use that model name")
REFUSED_MODELS: Dict[str, str] = {"collab_w_adapter_inference": _STAMP_REPO}
FUSION_OPS: Dict[str, str] = {"att": "att", "max": "max"}
# fusion.dataset -> data.format; opv2v4stamp: OPV2V read for STAMP (every agent feeds both stacks)
DATASETS: Dict[str, str] = {"opv2v": "opv2v", "v2xset": "opv2v", "dairv2x": "dairv2x", "v2xreal": "v2xreal",
                            "opv2v4stamp": "opv2v"}
OPTIMIZERS: Dict[str, str] = {"Adam": "adam", "AdamW": "adamw", "SGD": "sgd"}
SCHEDULERS = ("multistep", "step")

_DERIVED = "derived by OpenCOOD's yaml parser from the range and voxel size; recomputed here"
_PLACEHOLDER = "a placeholder in the reference (set per modality)"
_ANCHOR_NOTE = "equal to the detection range"
_STAMP_HEAD = ("a type's own fusion / head width in STAMP's model, which its adapter stage (train_adapter) does not "
               "build; collab_w_adapter: the ego type's is checked against the built model, the others' are not built")
_GENCOMM_BETAS = ("not read by the reference GenComm (cond_diff.py): its schedule is hard-coded linear in "
                  "sqrt(beta) from 5e-3 to 5e-2, which is our generator's default")

KEYS: Dict[str, Rule] = {
    # ---------------------------------------------------------------- bookkeeping
    "name": Mapped("name"),
    "yaml_parser": Fixed(("load_general_params",), "the reference's yaml post-processor"),
    "verify_mode": Dropped("the reference's train.py then trains on samples 1300-2399 and validates on the "
                           "first 300 (a debug subset); ours uses the whole splits"),
    "dataset_mode": Mapped("data.reader_options.mode (V2X-Real: vc, ic, v2v, ...)"),
    "yaml_parsers.<m>": Fixed(("load_general_params",), "the reference's per-type yaml post-processor (STAMP)"),
    "root_dir": Mapped("data.root, data.train_split"),
    "validate_dir": Mapped("data.val_split"),
    "test_dir": Mapped("data.test_split"),
    "data_dir": Mapped("data.root (DAIR-V2X)"),
    "train_params.batch_size": Mapped("train.batch_size"),
    "train_params.epoches": Mapped("train.epochs"),
    "train_params.eval_freq": Mapped("train.val_every"),
    "train_params.save_freq": Dropped("we write a checkpoint every epoch"),
    "train_params.max_cav": Mapped("data.max_agents"),
    "comm_range": Mapped("data.comm_range"),
    "input_source": Dropped("derived from the modality settings"),
    "label_type": Fixed(("lidar", "camera"), "ground truth from the labels ('camera': see the note printed "
                                             "with the conversion)"),
    "cav_lidar_range": Mapped("data.lidar_range"),
    "box_align.<rest>": Refused("CoAlign's box alignment (agent poses corrected from stage-1 boxes before "
                                "fusion) is not a step of this project"),
    "add_data_extension": Dropped("extra per-frame files (camera visibility masks) the models here do not read"),
    "data_augment": Dropped("HEAL's intermediate-fusion dataset does not apply it (only late and early "
                            "fusion do); augmentation is switched off to match"),
    "noise_setting.add_noise": Fixed((False,), "pose noise at training time (evaluate with gencomm-infer --pose_noise M,DEG)"),
    "ego_diff_cav": Approx("data.modality", "true: the reference types every agent after the ego with a random "
                           "non-ego model type, in evaluation too; ours types every agent from data.modality"),
    # ---------------------------------------------------------------- heterogeneous setting
    "heter.assignment_path": Mapped("data.modality"),
    "heter.ego_modality": Mapped("data.ego_types (the first agent of an ego type in the reference's order is "
                                 "the ego) and, for GenComm stage 2, stage.new_types (the other types)"),
    "heter.mapping_dict.<m>": Mapped("data.type_mapping"),
    "heter.lidar_channels_dict.<m>": Mapped("data.agent_types.<m>.lidar_beams"),
    "heter.modality_setting.<m>.sensor_type": Mapped("data.agent_types.<m>.sensor"),
    "heter.modality_setting.<m>.core_method": Mapped("model.agent_types.<m>.encoder.type"),
    "heter.modality_setting.<m>.preprocess.core_method": Fixed(("SpVoxelPreprocessor",), "voxeliser"),
    "heter.modality_setting.<m>.preprocess.args.voxel_size": Mapped("model.agent_types.<m>.encoder.voxel_size"),
    "heter.modality_setting.<m>.preprocess.args.max_points_per_voxel":
        Mapped("data.agent_types.<m>.max_points_per_voxel"),
    "heter.modality_setting.<m>.preprocess.args.max_voxel_train":
        Dropped("our voxeliser has one cap for training and testing, set to max_voxel_test"),
    "heter.modality_setting.<m>.preprocess.args.max_voxel_test": Mapped("data.agent_types.<m>.max_voxels"),
    "heter.modality_setting.<m>.preprocess.cav_lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "heter.modality_setting.<m>.grid_conf.xbound": Mapped(
        "model.agent_types.<m>.encoder.xbound (a camera grid other than the detection range is centre-cropped "
        "or zero-padded to it after the shrink header, as the reference; for GenComm the message is extracted "
        "before the pad, as the reference, and a grid past the range, which it would cut, is refused)"),
    "heter.modality_setting.<m>.grid_conf.ybound": Mapped("model.agent_types.<m>.encoder.ybound (as xbound)"),
    "heter.modality_setting.<m>.grid_conf.zbound": Mapped("model.agent_types.<m>.encoder.zbound"),
    "heter.modality_setting.<m>.grid_conf.ddiscr": Mapped("model.agent_types.<m>.encoder.depth_discretization"),
    "heter.modality_setting.<m>.grid_conf.mode": Mapped("model.agent_types.<m>.encoder.depth_mode (LID | UD)"),
    "heter.modality_setting.<m>.data_aug_conf.final_dim": Mapped("data.agent_types.<m>.image_size"),
    "heter.modality_setting.<m>.data_aug_conf.H": Fixed((600,), "OPV2V camera image height"),
    "heter.modality_setting.<m>.data_aug_conf.W": Fixed((800,), "OPV2V camera image width"),
    "heter.modality_setting.<m>.data_aug_conf.Ncams": Fixed((4,), "cameras per agent"),
    "heter.modality_setting.<m>.data_aug_conf.cams": Fixed(
        (["camera0", "camera1", "camera2", "camera3"],), "camera names"),
    "heter.modality_setting.<m>.data_aug_conf.resize_lim": Dropped(
        "training-time image resize/crop/rotate augmentation, not reproduced (test time: see bot_pct_lim)"),
    "heter.modality_setting.<m>.data_aug_conf.rot_lim": Dropped("image augmentation, not reproduced"),
    "heter.modality_setting.<m>.data_aug_conf.bot_pct_lim": Approx(
        "data.agent_types.<m>.image_size", "the reference resizes by max(final/H, final/W) and crops its rows "
        "from int((1 - mean(bot_pct_lim)) x resized H) - final H (for OPV2V's 600 x 800 and bot_pct_lim [0, 0.05]: "
        "about 10 black rows on top, 10 cut at the bottom); protocol: reference does the same with the mean "
        "0.025 of [0, 0.05] (every GenComm / HEAL yaml), protocol: native resizes the whole image to final_dim"),
    "heter.modality_setting.<m>.data_aug_conf.rand_flip": Fixed((False,), "image flip"),
    # ---------------------------------------------------------------- fusion / pre- / post-processing
    "fusion.core_method": Fixed(("intermediateheter", "intermediateheterv2xreal", "intermediateheteradapter"),
                                "heterogeneous intermediate-fusion dataset (OPV2V / DAIR-V2X, V2X-Real, STAMP)"),
    "fusion.dataset": Mapped("data.format"),
    "fusion.args.proj_first": Fixed((False,), "each agent encodes in its own frame"),
    "fusion.args.grid_conf": Dropped(_PLACEHOLDER),
    "fusion.args.data_aug_conf": Dropped(_PLACEHOLDER),
    "preprocess.core_method": Fixed(("SpVoxelPreprocessor",), "voxeliser"),
    "preprocess.args.voxel_size": Mapped("model.anchors.margin; checked: voxel x feature_stride = our feature cell"),
    "preprocess.args.max_points_per_voxel": Dropped(_PLACEHOLDER),
    "preprocess.args.max_voxel_train": Dropped(_PLACEHOLDER),
    "preprocess.args.max_voxel_test": Dropped(_PLACEHOLDER),
    "preprocess.cav_lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "preprocess.num_class": Same("class count", "model.args.num_class"),
    "preprocess.anchor_generator_config": Same("per-class anchors", "postprocess.anchor_args.anchor_generator_config"),
    "postprocess.anchor_args.anchor_generator_config": Mapped(
        "model.anchors (one size, bottom height and class per entry), model.pos_iou / neg_iou per class"),
    "postprocess.voxel_size": Mapped("model.anchors.margin without preprocess.args.voxel_size (a STAMP type's own "
                                     "post-processor); the anchors are laid on the common feature grid"),
    "postprocess.core_method": Fixed(("VoxelPostprocessor",), "anchor post-processor"),
    "postprocess.gt_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "postprocess.anchor_args.cav_lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "postprocess.anchor_args.l": Mapped("model.anchors.sizes"),
    "postprocess.anchor_args.w": Mapped("model.anchors.sizes"),
    "postprocess.anchor_args.h": Mapped("model.anchors.sizes"),
    "postprocess.anchor_args.r": Mapped("model.anchors.rotations"),
    "postprocess.anchor_args.feature_stride": Mapped("(checked against our feature cell)"),
    "postprocess.anchor_args.num": Mapped("(checked: one anchor per rotation)"),
    "postprocess.anchor_args.vw": Dropped(_DERIVED),
    "postprocess.anchor_args.vh": Dropped(_DERIVED),
    "postprocess.anchor_args.vd": Dropped(_DERIVED),
    "postprocess.anchor_args.W": Dropped(_DERIVED),
    "postprocess.anchor_args.H": Dropped(_DERIVED),
    "postprocess.anchor_args.D": Dropped(_DERIVED),
    "postprocess.target_args.pos_threshold": Mapped("model.pos_iou"),
    "postprocess.target_args.neg_threshold": Mapped("model.neg_iou"),
    "postprocess.target_args.score_threshold": Mapped("model.score_threshold"),
    "postprocess.order": Fixed(("hwl",), "box size order of the reference's regression (the weight importer "
                                         "permutes it to our l, w, h)"),
    "postprocess.max_num": Dropped("the reference pads (and truncates) ground truth to this many boxes per "
                                   "frame; we keep every box"),
    "postprocess.nms_thresh": Mapped("model.nms_iou"),
    "postprocess.dir_args.dir_offset": Fixed((math.pi / 4,), "direction-bin offset (pi / 4)"),
    "postprocess.dir_args.num_bins": Fixed((2,), "direction bins"),
    "postprocess.dir_args.anchor_yaw": Same("equal to anchor_args.r", "postprocess.anchor_args.r"),
    # ---------------------------------------------------------------- model
    "model.core_method": Mapped("model.fusion, model.link.type"),
    "model.args.ego_modality": Same("same as heter.ego_modality", "heter.ego_modality"),
    "model.args.lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "model.args.<m>.core_method": Same("encoder", "heter.modality_setting.<m>.core_method"),
    "model.args.<m>.sensor_type": Same("sensor", "heter.modality_setting.<m>.sensor_type"),
    "model.args.<m>.encoder_args.voxel_size": Same("voxel size",
                                                      "heter.modality_setting.<m>.preprocess.args.voxel_size"),
    "model.args.<m>.encoder_args.lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "model.args.<m>.encoder_args.pillar_vfe.use_norm": Fixed((True,), "BatchNorm in the pillar net"),
    "model.args.<m>.encoder_args.pillar_vfe.with_distance": Fixed((False,), "point distance feature"),
    "model.args.<m>.encoder_args.pillar_vfe.use_absolute_xyz": Fixed((True,), "absolute xyz point features"),
    "model.args.<m>.encoder_args.pillar_vfe.num_filters": Mapped("model.agent_types.<m>.encoder.num_filters"),
    "model.args.<m>.encoder_args.point_pillar_scatter.num_features": Same("equal to the last pillar width"),
    "model.args.<m>.encoder_args.point_pillar_scatter.grid_size": Dropped(_DERIVED),
    "model.args.<m>.encoder_args.mean_vfe.num_point_features": Fixed((4,), "x, y, z, intensity"),
    "model.args.<m>.encoder_args.spconv.num_features_in": Fixed(
        (4,), "SECOND input features (HEAL issue 20: 64 is a known wrong value)"),
    "model.args.<m>.encoder_args.spconv.num_features_out": Mapped("model.agent_types.<m>.encoder.out_z_channels"),
    "model.args.<m>.encoder_args.map2bev.feature_num": Same("equal to our SECOND output width"),
    "model.args.<m>.encoder_args.anchor_number": Dropped("unused by the camera encoder"),
    "model.args.<m>.encoder_args.grid_conf.<k>": Same("camera grid", "heter.modality_setting.<m>.grid_conf.<k>"),
    "model.args.<m>.encoder_args.data_aug_conf.<k>": Same("camera images",
                                                            "heter.modality_setting.<m>.data_aug_conf.<k>"),
    "model.args.<m>.encoder_args.img_downsample": Mapped("model.agent_types.<m>.encoder.img_downsample"),
    "model.args.<m>.encoder_args.img_features": Mapped("model.agent_types.<m>.encoder.context_channels"),
    "model.args.<m>.encoder_args.use_depth_gt": Fixed((False,), "predicted (not ground-truth) depth"),
    "model.args.<m>.encoder_args.depth_supervision": Mapped("data.agent_types.<m>.use_depth"),
    "model.args.<m>.encoder_args.camera_encoder": Mapped(
        "model.agent_types.<m>.encoder.trunk (EfficientNet: efficientnet_b0, Resnet101: resnet101; built "
        "here by name with random weights, no ImageNet download)"),
    "model.args.<m>.camera_mask_args.cav_lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "model.args.<m>.camera_mask_args.grid_conf.<k>": Same("camera grid", "heter.modality_setting.<m>.grid_conf.<k>"),
    "model.args.<m>.backbone_args.layer_nums": Mapped("model.agent_types.<m>.backbone.layer_nums (type base_bev)"),
    "model.args.<m>.backbone_args.layer_strides": Mapped("model.agent_types.<m>.backbone.layer_strides"),
    "model.args.<m>.backbone_args.num_filters": Mapped("model.agent_types.<m>.backbone.num_filters"),
    "model.args.<m>.backbone_args.upsample_strides": Mapped("model.agent_types.<m>.backbone.upsample_strides"),
    "model.args.<m>.backbone_args.num_upsample_filter": Mapped("model.agent_types.<m>.backbone.num_upsample_filters"),
    "model.args.<m>.backbone_args.inplanes": Same("equal to the encoder's output width"),
    "model.args.<m>.aligner_args.core_method": Fixed(
        ("identity", "convnext"), "feature aligner: none, or HEAL's ConvNeXt (aligner type convnext, heter_pyramid_collab)"),
    "model.args.<m>.aligner_args.spatial_align": Fixed((False,), "HEAL's AlignNet raises NotImplementedError for it"),
    "model.args.<m>.aligner_args.args.num_of_blocks": Mapped("model.agent_types.<m>.aligner.num_blocks"),
    "model.args.<m>.aligner_args.args.dim": Same("equal to the feature width"),
    "model.args.<m>.aligner_args.args.kernel_size": Mapped("model.agent_types.<m>.aligner.kernel_size"),
    "model.args.<m>.aligner_args.args.deform": Fixed((False,), "a ConvNeXt aligner without deformable convs"),
    "model.args.<m>.backbone_args": Fixed(("identity",), "the reference's identity backbone (a string in place of "
                                                       "the arguments): backbone type identity"),
    "model.args.<m>.shrink_header.dim": Mapped("model.agent_types.<m>.shrink.dims (type downsample_conv); STAMP's "
                                               "collab_w_adapter: the type's post-fusion shrink_conv, "
                                               "model.fusion_args.shrink of the ego type"),
    "model.args.<m>.shrink_header.stride": Mapped("model.agent_types.<m>.shrink.stride"),
    "model.args.<m>.shrink_header.kernal_size": Mapped("model.agent_types.<m>.shrink.kernel_size"),
    "model.args.<m>.shrink_header.padding": Mapped("model.agent_types.<m>.shrink.padding"),
    "model.args.<m>.shrink_header.input_dim": Same("equal to the backbone's output width"),
    "model.args.fusion_method": Mapped("model.fusion_op"),
    "model.args.att.feat_dim": Same("equal to the feature width"),
    "model.args.max.feat_dim": Same("equal to the feature width"),
    "model.args.in_head": Same("equal to the feature width"),
    "model.args.anchor_number": Same("equal to the number of anchor rotations"),
    "model.args.dir_args.dir_offset": Same("direction bins", "postprocess.dir_args.dir_offset"),
    "model.args.dir_args.num_bins": Same("direction bins", "postprocess.dir_args.num_bins"),
    "model.args.dir_args.anchor_yaw": Same("direction bins", "postprocess.dir_args.anchor_yaw"),
    "model.args.num_class": Same("class count: 1, or V2X-Real's 3 (anchor_generator_config)"),
    "model.args.compressor.<k>": Refused("NaiveCompressor (a learned channel compression of every feature "
                                         "before fusion) is not a module of this project"),
    "model.args.trick": Fixed((False,), "GenComm stage 2's 'trick' (the generated feature masked to the "
                                        "sender's non-empty cells)"),
    "model.args.in_head_single": Dropped("width of the per-agent heads, built only with supervise_single"),
    "model.args.missing_message": Mapped("model.link.missing_message (GenComm's 0.4 / 0.1; other models: refused)"),
    "model.args.supervise_single": Mapped("model.fusion_args.occupancy_weights (heter_pyramid_collab: its "
                                          "foreground loss; any other model: must be false)"),
    "model.args.message_extractor.in_ch": Same("equal to the feature width"),
    "model.args.message_extractor.out_ch": Mapped("model.link.message.message_channels (variant: reference)"),
    "model.args.enhancer": Mapped("model.link.enhancer (variant: reference)"),
    "model.args.enhancer.in_ch": Same("equal to the feature width"),
    "model.args.gmatch": Dropped("used only by the reference's train_gmatch.py gradient-matching script"),
    "model.args.gencomm.model.ch": Mapped("model.link.generator.base_channels (variant: reference)"),
    "model.args.gencomm.model.embed_dim": Dropped("stored by the reference GenComm, never used"),
    "model.args.gencomm.model.in_channels": Same("equal to the feature width"),
    "model.args.gencomm.model.out_ch": Same("equal to the feature width"),
    "model.args.gencomm.model.ch_mult": Mapped("model.link.generator.channel_mult"),
    "model.args.gencomm.model.num_res_blocks": Mapped("model.link.generator.num_res_blocks"),
    "model.args.gencomm.model.attn_resolutions": Dropped(
        "no attention at any level: the reference UNet's level i has the nominal resolution 128 / 2**i, none "
        "of them listed (a listed one is refused: our UNet has no attention)"),
    "model.args.gencomm.model.dropout": Fixed((0.0,), "UNet dropout"),
    "model.args.gencomm.model.resamp_with_conv": Fixed((True,), "UNet down/upsampling by convs"),
    "model.args.gencomm.diffusion.beta_schedule": Dropped(_GENCOMM_BETAS),
    "model.args.gencomm.diffusion.beta_start": Dropped(_GENCOMM_BETAS),
    "model.args.gencomm.diffusion.beta_end": Dropped(_GENCOMM_BETAS),
    "model.args.gencomm.diffusion.num_diffusion_timesteps": Mapped("model.link.generator.num_steps"),
    # ---------------------------------------------------------------- STAMP (heter_model_baseline_w_stamp)
    "heter.protocol_modality": Mapped("model.link.protocol"),
    "fusion.stamp": Dropped("STAMP's dataset switch (a post-processor per type, the assignment read by the base "
                            "dataset); here the types come from data.modality and one post-processor serves all"),
    "heter.modality_setting.<m>.preprocess.num_class": Same("class count", "preprocess.num_class"),
    "heter.modality_setting.<m>.preprocess.anchor_generator_config":
        Same("per-class anchors", "postprocess.anchor_args.anchor_generator_config"),
    "heter.modality_setting.<m>.postprocess.voxel_size": Dropped(
        "the voxel size of a STAMP type's own post-processor; the anchors are laid on the common feature grid"),
    "heter.modality_setting.<m>.postprocess.<rest>": Same("a type's own post-processing", "postprocess.<rest>"),
    "model.args.stage": Fixed(("train_adapter", "infer", "train_adapter_w_output", "train_adapter_output_only"),
                              "STAMP's stage (heter_model_baseline_w_stamp: train_adapter only; hypes_stamp.py)"),
    "model.args.protocol_modality": Same("the protocol type", "heter.protocol_modality"),
    "model.args.<m>.lidar_range": Same(_ANCHOR_NOTE, "cav_lidar_range"),
    # a type's own fusion and head: built by STAMP's model in every stage but train_adapter
    "model.args.<m>.in_head": Dropped(_STAMP_HEAD),
    "model.args.<m>.anchor_number": Dropped(_STAMP_HEAD),
    "model.args.<m>.dir_args.<k>": Dropped(_STAMP_HEAD),
    "model.args.<m>.fusion_method": Mapped("model.fusion_op (every type's must agree; the reference's adapter "
                                           "stage builds no fusion, ours runs the protocol owner's frozen one)"),
    "model.args.<m>.<k>.feat_dim": Dropped(_STAMP_HEAD),
    "model.args.<m>.<ar:adapter|reverter>.core_method": Fixed(("adapterconvnext", "adapterconv", "adapteratt"),
                                                              "STAMP's ConvNeXt, 1x1-conv or attention adapter "
                                                              "(model.link.adapter; stamp_adapters.py)"),
    "model.args.<m>.<ar:adapter|reverter>.args.<io:in_channels|out_channels>": Same("equal to the feature width"),
    "model.args.<m>.<ar:adapter|reverter>.args.<io:in_cav_lidar_range|out_cav_lidar_range>":
        Same(_ANCHOR_NOTE, "cav_lidar_range"),
    "model.args.<m>.<ar:adapter|reverter>.args.<io:in_feature_shape|out_feature_shape>":
        Same("the nominal feature grid (H, W); in and out must be equal: no resizing"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.num_of_blocks": Mapped("model.link.blocks"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.dim": Mapped("model.link.hidden_channels"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.kernel_size": Mapped("model.link.kernel_size"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.depth": Mapped("model.link.blocks (AdapterAtt)"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.<k:num_heads|patch_size>": Mapped("model.link.<k>"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.deform": Fixed((False,), "plain depth-wise convs"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.early_scale": Fixed((1.0,), "input scale"),
    "model.args.<m>.<ar:adapter|reverter>.args.submodule_args.late_upsample": Dropped(
        "where the adapter resizes; with in_feature_shape equal to out_feature_shape it resizes by 1"),
    "model.args.crop_to_visible": Fixed((False, True), "STAMP's alignment on every cell (heter_model_baseline_w_stamp: "
                                        "false only; collab_w_adapter: read by its alignment loss alone)"),
    # STAMP's own repository (collab_w_adapter)
    "model.args.<m>.head_method": Fixed(("point_pillar_pyramid_object_detection_head",),
                                        "STAMP's anchor head (1x1 cls / reg / dir convs on the type's fused map)"),
    "model.args.<m>.fusion_backbone.<k>": Mapped("model.fusion_args (the ego type's PyramidFusion; the other "
                                                 "types' are not built)"),
    "model.args.<m>.fusion_backbone": Fixed(("pyramid",), "a placeholder the file overrides with the arguments"),
    "model.args.heterogeneous": Dropped("stored by STAMP's model, never read"),
    "model.args.<m>.visible_range": Dropped("read only with crop_to_visible"),
    "loss_adapter.core_method": Fixed(("adapter_loss",), "STAMP's alignment loss"),
    "loss_adapter.args.alpha_M2P": Mapped("model.link.m2p_weight"),
    "loss_adapter.args.alpha_P2M": Mapped("model.link.p2m_weight"),
    "loss_adapter.args.alpha_M2P2M": Mapped("model.link.cycle_weight"),
    "loss.<m>.<rest>": Dropped("a type's own detection loss (its stage-1 training); STAMP's adapter stage trains "
                               "with loss_adapter, here plus the detection loss through the protocol owner's "
                               "frozen fusion and head (opencood_ext/methods/stamp.py)"),
    # ---------------------------------------------------------------- HEAL's Pyramid Fusion (heter_pyramid_collab)
    "model.args.fusion_backbone.resnext": Mapped("model.fusion_args.resnext"),
    "model.args.fusion_backbone.layer_nums": Mapped("model.fusion_args.layer_nums"),
    "model.args.fusion_backbone.layer_strides": Mapped("model.fusion_args.layer_strides"),
    "model.args.fusion_backbone.num_filters": Mapped("model.fusion_args.num_filters"),
    "model.args.fusion_backbone.upsample_strides": Mapped("model.fusion_args.upsample_strides"),
    "model.args.fusion_backbone.num_upsample_filter": Mapped("model.fusion_args.num_upsample_filters"),
    "model.args.fusion_backbone.inplanes": Same("equal to the agents' feature width"),
    "model.args.fusion_backbone.anchor_number": Dropped("stored in PyramidFusion's config, never read"),
    "model.args.fusion_backbone.align_corners": Fixed((False,), "grid sampling without align_corners"),
    "model.args.shrink_header.kernal_size": Mapped("model.fusion_args.shrink.kernel_size"),
    "model.args.shrink_header.stride": Mapped("model.fusion_args.shrink.stride"),
    "model.args.shrink_header.padding": Mapped("model.fusion_args.shrink.padding"),
    "model.args.shrink_header.dim": Mapped("model.fusion_args.shrink.dims"),
    "model.args.shrink_header.input_dim": Same("equal to the fusion backbone's width (sum num_upsample_filter)"),
    "loss.args.pyramid.weight": Mapped("model.fusion_args.occupancy_weights"),
    "loss.args.pyramid.relative_downsample": Same("equal to each level's stride, prod(layer_strides[:i + 1])"),
    # ---------------------------------------------------------------- loss, optimiser, schedule
    "loss.core_method": Fixed(("point_pillar_loss", "point_pillar_depth_loss", "point_pillar_pyramid_loss", "point_pillar_gencomm_loss",
                               "point_pillar_v2xreal_loss", "point_pillar_v2xreal_gencomm_loss"),
                              "detection loss"),
    "loss.args.pos_cls_weight": Mapped("model.loss.pos_cls_weight"),
    "loss.args.cls.type": Fixed(("SigmoidFocalLoss",), "classification loss"),
    "loss.args.cls.alpha": Mapped("model.loss.focal_alpha"),
    "loss.args.cls.gamma": Mapped("model.loss.focal_gamma"),
    "loss.args.cls.weight": Mapped("model.loss.cls_weight"),
    "loss.args.reg.type": Fixed(("WeightedSmoothL1Loss",), "box loss"),
    "loss.args.reg.sigma": Mapped("model.loss.smooth_l1_beta (= 1 / sigma^2)"),
    "loss.args.reg.codewise": Fixed((True,), "per-code box loss"),
    "loss.args.reg.weight": Mapped("model.loss.box_weight"),
    "loss.args.dir.type": Fixed(("WeightedSoftmaxClassificationLoss",), "direction loss"),
    "loss.args.dir.weight": Mapped("model.loss.dir_weight"),
    "loss.args.dir.args.dir_offset": Same("direction bins", "postprocess.dir_args.dir_offset"),
    "loss.args.dir.args.num_bins": Same("direction bins", "postprocess.dir_args.num_bins"),
    "loss.args.dir.args.anchor_yaw": Same("direction bins", "postprocess.dir_args.anchor_yaw"),
    "loss.args.depth.weight": Mapped("model.depth_weight (the reference's focal loss over depth bins: "
                                     "lss_reference.depth_loss)"),
    "loss.args.generate_weight": Mapped("model.link.generation_weight"),
    "loss.args.da": Dropped("read only by the MPDA losses (point_pillar_mpda_loss); the detection losses "
                            "named here ignore it"),
    # V2X-Real's loss (point_pillar_v2xreal_loss): focal alpha 0.25 / gamma 2 and smooth-L1 beta 1/9 are
    # hard-coded, positives weigh 1, no direction term
    "loss.args.cls_weight": Mapped("model.loss.cls_weight"),
    "loss.args.reg": Mapped("model.loss.box_weight"),
    "loss.args.num_class": Same("class count", "model.args.num_class"),
    "loss.args.gmatch_weight": Dropped("used only by the reference's train_gmatch.py gradient-matching script"),
    "optimizer.core_method": Mapped("train.optimizer"),
    "optimizer.lr": Mapped("train.lr"),
    "optimizer.args.weight_decay": Mapped("train.weight_decay"),
    "optimizer.args.momentum": Mapped("train.momentum"),
    "optimizer.args.eps": Dropped("our Adam uses torch's default eps, 1e-8 (TrainConfig has no eps)"),
    "lr_scheduler.core_method": Mapped("train.lr_scheduler"),
    "lr_scheduler.gamma": Mapped("train.gamma"),
    "lr_scheduler.step_size": Mapped("train.milestones"),
}

_COMPILED = [(compile_pattern(p), r) for p, r in KEYS.items()]


# Sections handed whole to a reference module's constructor (encoder, backbone, shrink header, the
# GenComm UNet, STAMP's adapters): an argument the table does not know may change what that module
# computes, so an unknown key under one of them is refused, not warned about.
STRICT_SECTIONS: Tuple[str, ...] = (
    "model.args.<m>.encoder_args", "model.args.<m>.backbone_args", "model.args.<m>.shrink_header",
    "model.args.gencomm", "model.args.message_extractor", "model.args.<m>.<ar:adapter|reverter>", "loss_adapter")
_STRICT = [re.compile(compile_pattern(p).pattern[:-2] + r"\.") for p in STRICT_SECTIONS]


def strict_section(path: str) -> Optional[str]:
    """The :data:`STRICT_SECTIONS` entry ``path`` lies under, if any."""
    for rx, pattern in zip(_STRICT, STRICT_SECTIONS):
        if rx.match(path):
            return pattern
    return None


def rule_for(path: str) -> Optional[Tuple[Rule, Dict[str, str]]]:
    """(rule, the ``<m>`` / ``<k>`` segments) for a dotted key path; None when the key is not known."""
    for rx, rule in _COMPILED:
        found = rx.match(path)
        if found:
            return rule, found.groupdict()
    return None
