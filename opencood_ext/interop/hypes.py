"""Convert a HEAL / GenComm-reference hypes yaml into our experiment config.

    conv = convert_hypes_file("m1_att.yaml")          # raises HypesError listing unsupported keys
    print(conv.yaml()); print(conv.report())
    for line in conv.warnings(): print(line)           # keys not read by this project, one line each
    cfg = conv.experiment()                            # ExperimentConfig, validated

Which key goes where is :data:`opencood_ext.interop.hypes_keys.KEYS`; this
module reads those keys and builds the ``data`` / ``model`` / ``train`` /
``eval`` / ``stage`` sections (model sections in :mod:`.hypes_model`). Every
converted config runs with ``protocol: reference`` (the reference's computation,
opencood_ext/experiment.py PROTOCOLS).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from ..config import ConfigError, apply_overrides, config_from_dict
from ..experiment import ExperimentConfig
from .hypes_detect import V2XREAL_CLASS_GROUPS
from .hypes_keys import DATASETS, MODELS, OPTIMIZERS, SCHEDULERS
from .hypes_model import check_model, model_section, modality_names
from .hypes_reader import HypesError, HypesReader, read_yaml, warning_line
from .hypes_stamp import STAMP_COLLAB_MODELS, collab_ego, stamp_stage


@dataclass
class Conversion:
    """A converted hypes file.

    config: our experiment config as a plain dict (``yaml()`` prints it).
    approximations / dropped: (key path, reason) of what is carried over
    approximately and what is not read by this project (:meth:`warnings`).
    files: extra files the config refers to (a copied modality assignment),
    path -> text; :meth:`write_files` writes them.
    """

    source: str
    config: dict
    approximations: List[Tuple[str, str]] = field(default_factory=list)
    dropped: List[Tuple[str, str]] = field(default_factory=list)
    files: Dict[Path, str] = field(default_factory=dict)

    def yaml(self) -> str:
        return yaml.safe_dump(self.config, sort_keys=False, default_flow_style=None)

    def report(self) -> str:
        lines = [f"# converted from {self.source}"]
        for title, items in (("carried over approximately", self.approximations),
                             ("not read by this project", self.dropped)):
            if items:
                lines.append(f"# {title}:")
                first: Dict[str, str] = {}
                for path, why in items:
                    first.setdefault(path, why)
                lines += [f"#   {path}: {why}" for path, why in first.items()]
        return "\n".join(lines)

    def warnings(self) -> List[str]:
        """``WARNING: FILE: key 'PATH': not read by this project: WHY``, one line per key not read."""
        first: Dict[str, str] = {}
        for path, why in self.dropped:
            first.setdefault(path, why)
        return [warning_line(self.source, path, why) for path, why in first.items()]

    def experiment(self, overrides: Sequence[str] = ()) -> ExperimentConfig:
        """Validate through our schema (``--set`` overrides in our key space apply first)."""
        data = json.loads(json.dumps(self.config))
        prov = {(): f"{self.source} (converted)"}
        apply_overrides(data, prov, overrides)
        return config_from_dict(ExperimentConfig, data, prov)

    def write_files(self) -> None:
        for path, text in self.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)


def _splits(r: HypesReader, fmt: str) -> Dict[str, str]:
    train, val, test = (r.get(k) for k in ("root_dir", "validate_dir", "test_dir"))
    if None in (train, val, test):
        return {}
    if fmt == "dairv2x":  # splits are JSON lists of frame ids; the data lives under data_dir
        return {"root": r.get("data_dir"), "train_split": train, "val_split": val, "test_split": test}
    paths = [Path(p) for p in (train, val, test)]
    if len({p.parent for p in paths}) != 1:
        r.refuse("validate_dir", f"root_dir, validate_dir and test_dir must share one parent folder "
                                 f"(ours is data.root/<split>); got {[str(p) for p in paths]}")
    return {"root": str(paths[0].parent), "train_split": paths[0].name, "val_split": paths[1].name,
            "test_split": paths[2].name}


def _find(path: str, source: Path) -> Optional[Path]:
    """``path`` as given, else relative to the working folder or to any folder above the hypes file."""
    p = Path(path)
    if p.is_absolute():
        return p if p.exists() else None
    for base in (Path.cwd(), *source.resolve().parents):
        if (base / p).exists():
            return (base / p).resolve()
    return None


def _modality(r: HypesReader, types: List[str], fmt: str, source: Path, remap_to: Optional[Path],
              files: Dict[Path, str], data: dict) -> Optional[str]:
    """data.modality from heter.assignment_path + heter.mapping_dict (a remap also sets data.type_mapping)."""
    keys = r.children("heter.mapping_dict")
    mapping = {k: r.get(f"heter.mapping_dict.{k}") for k in keys}
    bad = {k: v for k, v in mapping.items() if v not in types}
    if bad and len(bad) == len(mapping):
        r.refuse("heter.mapping_dict", f"maps every type to types the model does not have: {bad} (model types "
                                       f"{types})")
        return None
    if bad:  # the reference's dataset leaves such agents out (Adaptor.unmatched_modality); so does ours
        r.approximations.append(("heter.mapping_dict", f"agents mapped to {sorted(set(bad.values()))} (no model "
                                 f"type) are left out, as the reference's dataset leaves them out"))
    targets = list(dict.fromkeys(mapping.values()))
    if len(targets) == 1 and not bad:
        return f"all:{targets[0]}"
    assignment = r.get("heter.assignment_path", None)
    if fmt == "dairv2x" and assignment is None:  # HEAL: the vehicle is m1, the roadside unit m2, then mapped
        if "m1" not in mapping or "m2" not in mapping:
            r.refuse("heter.mapping_dict", "DAIR-V2X needs entries for m1 (vehicle) and m2 (roadside unit)")
            return None
        return f"cycle:{mapping['m1']},{mapping['m2']}"
    if assignment is None:
        r.refuse("heter.assignment_path", "missing: needed to assign more than one type")
        return None
    found = _find(assignment, source)
    if all(k == v for k, v in mapping.items()):
        if found is None:
            r.approximations.append(("heter.assignment_path", f"not found now; data.modality points to "
                                     f"{Path.cwd() / assignment}, which must exist when the data is read"))
            return str(Path.cwd() / assignment)
        return str(found)
    # a real remap (e.g. m2 -> m1, m4 -> m3): for OPV2V-format data the assignment as the reference reads
    # it, copied beside the converted config, and data.type_mapping (the reference tests the first agent's
    # type before the mapping, so the assigned types are kept: data/reference.py); the other readers take
    # no assignment (data.type_mapping is refused there): the copy has the mapped types, as before
    if found is None or remap_to is None:
        where = "is not found" if found is None else "would need a copy beside the converted config"
        r.refuse("heter.mapping_dict", f"remaps types ({mapping}) and the assignment file {assignment} {where}; "
                                       f"convert with tools/import_config.py IN.yaml -o OUT.yaml (run where "
                                       f"{assignment} resolves): it writes the assignment to OUT.modality.json")
        return None
    try:
        table = json.loads(found.read_text())
        remapped = {scn: {cav: mapping[m] for cav, m in cavs.items()} for scn, cavs in table.items()}
    except (ValueError, AttributeError, KeyError) as exc:
        r.refuse("heter.assignment_path", f"{found}: not a {{scenario: {{agent: type}}}} JSON the mapping "
                                          f"covers ({type(exc).__name__}: {exc})")
        return None
    if fmt == "opv2v":
        files[remap_to] = found.read_text()  # unchanged: the reference reads its keys in the file's order
        data["type_mapping"] = mapping
    else:
        files[remap_to] = json.dumps(remapped, indent=1, sort_keys=True)
    return str(remap_to.resolve())


def _data_section(r: HypesReader, types: List[str], source: Path, remap_to: Optional[Path],
                  files: Dict[Path, str]) -> dict:
    dataset = r.get("fusion.dataset", "opv2v")
    fmt = DATASETS.get(dataset)
    if fmt is None:
        r.refuse("fusion.dataset", f"dataset {dataset!r} not supported; one of {sorted(DATASETS)}")
        fmt = "opv2v"
    data = {"format": fmt, **_splits(r, fmt), "lidar_range": r.get("cav_lidar_range"),
            "augment": {"enabled": False}}
    for key, ours in (("comm_range", "comm_range"), ("train_params.max_cav", "max_agents")):
        if r.has(key):
            data[ours] = r.get(key)
    if fmt == "v2xreal":  # the reference keeps the stored intensity and groups the object types in 3 classes
        data["reader_options"] = {"mode": r.get("dataset_mode"), "intensity": "raw"}
        data["class_groups"] = V2XREAL_CLASS_GROUPS
    # STAMP's own collaboration: the ego type first (its model is the converted one), set by convert_hypes
    collab = r.get("model.core_method", None) in STAMP_COLLAB_MODELS and r.get("model.args.stage", "infer") == "infer"
    modality = None if collab else _modality(r, types, fmt, source, remap_to, files, data)
    if modality is not None:
        data["modality"] = modality
    agent_types = {}
    for m in types:
        base = f"heter.modality_setting.{m}"
        if r.get(f"{base}.sensor_type", None) == "camera":
            spec = {"sensor": "camera", "image_size": r.get(f"{base}.data_aug_conf.final_dim"),
                    "use_depth": bool(r.get(f"model.args.{m}.encoder_args.depth_supervision", False))}
        else:
            spec = {"sensor": "lidar", "lidar_beams": r.get(f"heter.lidar_channels_dict.{m}", 64)}
            for key, ours in (("max_points_per_voxel", "max_points_per_voxel"), ("max_voxel_test", "max_voxels")):
                if r.has(f"{base}.preprocess.args.{key}"):
                    spec[ours] = r.get(f"{base}.preprocess.args.{key}")
        agent_types[m] = spec
    data["agent_types"] = agent_types
    return data


def _train_section(r: HypesReader) -> dict:
    train = {"epochs": r.get("train_params.epoches"), "batch_size": r.get("train_params.batch_size"),
             "lr": r.get("optimizer.lr")}
    if r.has("train_params.eval_freq"):
        train["val_every"] = r.get("train_params.eval_freq")
    opt = r.get("optimizer.core_method", "Adam")
    if opt not in OPTIMIZERS:
        r.refuse("optimizer.core_method", f"{opt!r} not supported; one of {sorted(OPTIMIZERS)}")
    train["optimizer"] = OPTIMIZERS.get(opt, "adam")
    for key, ours in (("optimizer.args.weight_decay", "weight_decay"), ("optimizer.args.momentum", "momentum")):
        if r.has(key):
            train[ours] = r.get(key)
    sched = r.get("lr_scheduler.core_method", None)
    if sched is None:
        return train
    if sched not in SCHEDULERS:
        r.refuse("lr_scheduler.core_method", f"{sched!r} not supported; one of {list(SCHEDULERS)}")
        return train
    steps = r.get("lr_scheduler.step_size")
    epochs = train["epochs"] if isinstance(train["epochs"], int) else 0
    if sched == "step":  # StepLR(step_size=s): x gamma every s epochs == milestones s, 2s, ...
        if not isinstance(steps, int) or steps <= 0:
            r.refuse("lr_scheduler.step_size", f"scheduler 'step' needs a positive integer, got {steps!r}")
            return train
        steps = list(range(steps, max(epochs, steps + 1), steps))
    if not steps:  # MultiStepLR without milestones: the rate stays constant (ours: no scheduler)
        return train
    train.update(lr_scheduler="multistep", milestones=list(steps), gamma=r.get("lr_scheduler.gamma", 0.1))
    return train


def _ego_types(r: HypesReader, types: List[str], new_types: List[str]) -> Optional[List[str]]:
    """``data.ego_types`` from ``heter.ego_modality`` ("m1" or "m1&m2"): where the reference's dataset
    puts an agent of these (mapped) types first (``Adaptor.reorder_cav_list`` in evaluation; its
    training gives the first agent such a type), when they narrow the model's types. None when
    every model type may lead, or when the file names types the model lacks (a one-type stage 1
    whose ``ego_modality`` is another type's: every agent is of the model's type)."""
    ego = [t for t in str(r.get("heter.ego_modality", "")).split("&") if t]
    if not ego or not set(ego) < set(types) or set(ego) & set(new_types):
        return None
    return [t for t in types if t in ego]


def _shared_postprocess(data: dict) -> Tuple[dict, Optional[str]]:
    """STAMP's files give each type its own ``postprocess`` and none at the top: the first type's is
    used (the others are checked against it, key by key). -> (data, that type or None)."""
    if "postprocess" in data:
        return data, None
    setting = (data.get("heter") or {}).get("modality_setting") if isinstance(data.get("heter"), dict) else None
    for m, spec in (setting or {}).items():
        if isinstance(spec, dict) and isinstance(spec.get("postprocess"), dict):
            return {**data, "postprocess": spec["postprocess"]}, str(m)
    return data, None


def convert_hypes(data: dict, source: Path, remap_to: Optional[Path] = None, check: bool = True,
                  duplicates: Sequence[str] = ()) -> Conversion:
    """Convert a parsed hypes mapping; raises :class:`HypesError` listing every unsupported key.

    source: the file (errors name it; the assignment file is searched above it).
    remap_to: where the modality assignment of a type remap is copied (None: refuse remaps).
    check: build the model and check the widths and the feature grid against the file.
    """
    source = Path(source)
    data, shared_post = _shared_postprocess(data)
    r = HypesReader(data, str(source))
    if shared_post:
        r.approximations.append(("postprocess", f"absent; taken from heter.modality_setting.{shared_post}."
                                 f"postprocess (every type's must agree)"))
    r.dropped += [(k, "given twice; the last value is used, as the reference's loader does")
                  for k in dict.fromkeys(duplicates)]
    types = modality_names(r)
    files: Dict[Path, str] = {}
    config = {"name": str(r.get("name", source.stem)).replace(" ", "_"),
              "protocol": "reference",
              "data": _data_section(r, types, source, remap_to, files),
              "model": model_section(r, types),
              "train": _train_section(r),
              "eval": {"split": "test"}}
    config["eval"]["split"] = config["data"].get("test_split", "test")
    if r.get("model.core_method", None) == "heter_model_baseline_w_gencomm_stage2":
        ego = str(r.get("heter.ego_modality", ""))
        config["stage"] = {"new_types": [t for t in types if t not in ego.split("&")]}
    if r.get("model.core_method", None) in STAMP_COLLAB_MODELS and r.get("model.args.stage", "infer") == "infer":
        ego = collab_ego(r, types)
        config["data"]["modality"] = "cycle:" + ",".join([ego, *[t for t in types if t != ego]])
        r.approximations.append(("heter.mapping_dict", f"data.modality {config['data']['modality']}: the ego is "
                                 f"{ego} (the converted model's type), its collaborators cycle through the types; "
                                 f"the reference's assignment of types to agents is not carried over"))
    if MODELS.get(r.get("model.core_method", None)) == "stamp":
        stamp = stamp_stage(r, types)
        config["stage"], config["data"]["modality"] = stamp["stage"], stamp["modality"]
    else:
        ego_types = _ego_types(r, types, config.get("stage", {}).get("new_types", []))
        if ego_types:
            config["data"]["ego_types"] = ego_types
    r.raise_problems()
    conv = Conversion(str(source), config, r.approximations, r.dropped, files)
    if check:
        from ..experiment import build_model
        try:
            model = build_model(conv.experiment())
        except (ConfigError, ValueError, TypeError) as exc:
            raise HypesError(f"{source}: the converted config does not build: {exc}") from None
        check_model(r, model)
        r.raise_problems()
    return conv


def convert_hypes_file(path, remap_to: Optional[Path] = None, check: bool = True) -> Conversion:
    data, dups = read_yaml(Path(path))
    return convert_hypes(data, Path(path), remap_to=remap_to, check=check, duplicates=dups)
