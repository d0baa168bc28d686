"""model.init_from: start a run from saved weights instead of the seeded initialisation.

PATH is one of
  - a distfl run directory: its final model, the newest checkpoint of a finished run (its state.pt);
  - a PyTorch state dict (name -> tensor), read with torch.load(weights_only=True);
  - a safetensors file (.safetensors).
The file is read once: the bytes read are hashed (summary.json's data_files, checked on resume) and
loaded. Names and shapes are checked against the built model before any work; a parameter missing from
the file, a name the model does not have, or another shape stops the run with one line naming it and the
file. Buffers (BatchNorm's running statistics) are loaded when the file holds them and keep their seeded
values when it does not.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import io
import json
from pathlib import Path

import torch

from .. import checkpoint
from ..errors import ConfigError
from .local import FlatModel


def layout(worker) -> dict:
    """The names and shapes behind a FlatModel's flat tensors, which a checkpoint stores beside them, so
    that a later run can read the checkpoint's model by name (`checkpoint_state_dict`)."""
    module = worker.module
    buffer_names = {id(b): name for name, b in module.named_buffers()}
    # worker.frozen: a fixed head's persistent buffers, then the frozen parameters (requires_grad=False)
    fixed_names = {**buffer_names, **{id(p): name for name, p in module.named_parameters()}}
    return {"params": [[name, list(module.get_parameter(name).shape)] for name in worker.param_slices],
            "buffers": [[name, list(module.get_buffer(name).shape)] for name in worker.buffer_slices],
            "int_buffers": [buffer_names[id(b)] for b in worker.int_buffers],
            "frozen": [fixed_names[id(t)] for t in worker.frozen],
            "keys": list(module.state_dict().keys())}


def checkpoint_state_dict(state: dict, where: str, model: torch.nn.Module, model_config: dict) -> dict[str, torch.Tensor]:
    """The model a checkpoint's state.pt holds, as a state dict (name -> tensor). A checkpoint of an earlier
    distfl names none of its tensors: it is read by the layout of `model` when it was trained with the same
    model.* keys (`model_config`), so built the same way, and holds tensors of the same sizes."""
    names = state.get("layout")
    if not isinstance(names, dict):
        names = layout(FlatModel(copy.deepcopy(model)))
        saved = (state.get("config") or {}).get("model") or {}
        if (any(model_config.get(key) != value for key, value in saved.items() if key != "init_from")
                or state["params"].numel() != sum(torch.Size(shape).numel() for _, shape in names["params"])
                or state["buffers"].numel() != sum(torch.Size(shape).numel() for _, shape in names["buffers"])
                or len(state["int_buffers"]) != len(names["int_buffers"]) or len(state["frozen"]) != len(names["frozen"])):
            raise ConfigError(f"model.init_from: {where} was written by an earlier distfl, whose checkpoints do not "
                              "name the model's tensors, for another model; load a state dict or safetensors file "
                              "instead")
    tensors: dict[str, torch.Tensor] = {}
    for flat, entries in ((state["params"], names["params"]), (state["buffers"], names["buffers"])):
        offset = 0
        for name, shape in entries:
            n = int(torch.Size(shape).numel())
            tensors[name] = flat[offset:offset + n].view(shape)
            offset += n
    tensors.update(zip(names["int_buffers"], state["int_buffers"]))
    tensors.update(zip(names["frozen"], state["frozen"]))
    return {name: tensors[name] for name in names["keys"] if name in tensors}


def _final_checkpoint(run_dir: Path) -> Path:
    """The state.pt of a finished run's newest checkpoint."""
    try:
        status = json.loads((run_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        status = None
    if status != "completed":
        raise ConfigError(f"model.init_from: {run_dir} is not a finished distfl run (summary.json status "
                          f"{status or 'missing'}), so it has no final model; finish it first, or give a state "
                          "dict or safetensors file")
    found = checkpoint.complete_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"model.init_from: {run_dir} holds no checkpoint, so its final model was not kept")
    try:
        checkpoint.verify(found[-1])
    except Exception as exc:
        raise ConfigError(f"model.init_from: cannot read {run_dir}'s final model: {exc}") from None
    return found[-1] / "state.pt"


def read(path: str, model: torch.nn.Module, model_config: dict) -> tuple[dict[str, torch.Tensor], Path, str]:
    """The state dict at `path` (a run directory, a torch state dict file, a safetensors file), the file
    read, and the SHA-256 of its bytes. `model`, `model_config`: the run's, for an earlier distfl's checkpoint."""
    source = Path(path)
    file = _final_checkpoint(source) if source.is_dir() else source
    try:
        data = file.read_bytes()
    except OSError as exc:
        raise ConfigError(f"model.init_from: cannot read {file}: {exc.strerror or exc}") from None
    sha256 = hashlib.sha256(data).hexdigest()
    try:
        if file.suffix == ".safetensors":
            from safetensors.torch import load as load_safetensors

            state = load_safetensors(data)
        else:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch and safetensors raise several types for a foreign or truncated file
        kind = "safetensors" if file.suffix == ".safetensors" else "PyTorch state dict (torch.load, weights_only=True)"
        raise ConfigError(f"model.init_from: cannot read {file} as a {kind}: {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
    if isinstance(state, dict) and "format_version" in state and "params" in state:  # a checkpoint's state.pt
        state = checkpoint_state_dict(state, str(file), model, model_config)
    if not isinstance(state, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                              for k, v in state.items()):
        raise ConfigError(f"model.init_from: {file} holds a {type(state).__name__}, not a state dict "
                          "(a mapping of names to tensors)")
    return state, file, sha256


def onto_adapters(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A base model's weights named for a model with LoRA adapters (models/adapters.py): PEFT keeps each
    adapted layer's own weights under NAME.base_layer.*, and its adapters (NAME.lora_A/B) keep their start.
    A state that already has adapter names (a LoRA run's checkpoint) is returned as it is."""
    own = model.state_dict()
    if not any(".base_layer." in name for name in own) or any(".base_layer." in name for name in state):
        return state
    mapped, used = {}, set()
    for name in own:
        base = name.replace(".base_layer.", ".")
        if base in state:
            mapped[name] = state[base]
            used.add(base)
    mapped.update({name: tensor for name, tensor in state.items() if name not in used})  # named as unexpected
    return mapped


def first_mismatch(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> str | None:
    """What first keeps `state` from loading into `model`: a parameter it lacks, a name the model does not
    have, or another shape. Buffers it lacks keep the model's own values."""
    own = model.state_dict()
    parameters = {name for name, _ in model.named_parameters()}
    for name in own:
        if name not in state and name in parameters and ".lora_" not in name:  # adapters keep their start
            return f"missing key {name} (the model's parameter of shape {tuple(own[name].shape)})"
    for name in state:
        if name not in own:
            return f"unexpected key {name} (the model has no such parameter or buffer)"
    for name, tensor in own.items():
        if name in state and tuple(state[name].shape) != tuple(tensor.shape):
            return f"{name} has shape {tuple(state[name].shape)} in the file, {tuple(tensor.shape)} in the model"
    return None


def load_into(model: torch.nn.Module, model_config) -> tuple[Path, str]:
    """Overwrite `model`'s parameters (and the buffers the file holds) with the weights at
    `model_config.init_from` (the run's model.* section), after checking names and shapes. Returns the
    file read and its SHA-256."""
    state, file, sha256 = read(model_config.init_from, model, dataclasses.asdict(model_config))
    state = onto_adapters(model, state)
    wrong = first_mismatch(model, state)
    if wrong is not None:
        raise ConfigError(f"model.init_from: {file} does not fit model.name={model_config.name}: {wrong}")
    own = model.state_dict()
    with torch.no_grad():
        for name, tensor in state.items():
            own[name].copy_(tensor)
    return file, sha256

