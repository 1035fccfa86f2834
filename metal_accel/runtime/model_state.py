"""The user's model, untouched: what optimize() may change is recorded first and put back after.

optimize() runs the user's model (capture), reference runs, perturbed proofs and, in this process,
the speed gate of untrusted host code. None of that may leave a trace on the model. A `StateGuard`
records every parameter and buffer (the tensor object, its `requires_grad`, its version counter) and
every module's training flag when optimize() starts; the modules a proof is about to run on are
copied (`protect`) just before, so only they cost memory. `restore()` then puts everything back:
replaced tensors, `requires_grad` flags, training flags, and the bits of every protected tensor that
differ from its copy. An unprotected tensor whose version counter moved was written in place by the
model's own eager code (nothing untrusted ever sees it); it is reported, there is no copy to restore.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when A and B hold the same bits (NaN payloads and -0.0 included), shape and dtype alike."""
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.is_meta:
        return True
    if a.is_complex():
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.is_floating_point():
        as_int = _INT_OF_SIZE[a.element_size()]
        a, b = a.view(as_int), b.view(as_int)
    return torch.equal(a, b)


def _version(t: torch.Tensor) -> int | None:
    try:
        return t._version
    except RuntimeError:  # an inference tensor keeps no version counter
        return None


@dataclass
class _Slot:
    """One parameter or buffer of one module, as it was when the guard was made."""

    path: str            # the module's name in the model ("" for the model itself)
    owner: nn.Module
    store: str           # "_parameters" or "_buffers"
    name: str
    tensor: torch.Tensor
    requires_grad: bool
    version: int | None

    @property
    def label(self) -> str:
        return f"{self.path}.{self.name}" if self.path else self.name


@dataclass
class StateGuard:
    """Every parameter, buffer and training flag of MODEL as it is now; see the module docstring."""

    model: nn.Module
    slots: list[_Slot] = field(default_factory=list)
    modes: list[tuple[str, nn.Module, bool]] = field(default_factory=list)
    copies: dict[int, torch.Tensor] = field(default_factory=dict)  # id(tensor) -> its copy

    def __post_init__(self) -> None:
        for path, module in self.model.named_modules():
            self.modes.append((path, module, module.training))
            for store in ("_parameters", "_buffers"):
                for name, t in getattr(module, store).items():
                    if t is not None:
                        self.slots.append(_Slot(path, module, store, name, t, t.requires_grad, _version(t)))

    def training_modules(self) -> list[str]:
        """Names of the modules that were in training mode when the guard was made."""
        return [path or type(m).__name__ for path, m, training in self.modes if training]

    def eval(self) -> None:
        """Every module in eval mode (restore() puts the flags back)."""
        for _, module, _ in self.modes:
            module.training = False

    def protect(self, module: nn.Module) -> None:
        """Copy the tensors of MODULE and its descendants not copied yet (a proof is about to run on them)."""
        inside = {id(m) for m in module.modules()}
        with torch.no_grad():
            for slot in self.slots:
                if id(slot.owner) in inside and id(slot.tensor) not in self.copies:
                    self.copies[id(slot.tensor)] = slot.tensor.detach().clone()

    def protect_all(self) -> None:
        self.protect(self.model)

    def restore(self) -> list[str]:
        """Put back everything that changed since the guard was made; one sentence per change found."""
        changes: list[str] = []
        for path, module, training in self.modes:
            if module.training != training:
                module.training = training
        for slot in self.slots:
            store = getattr(slot.owner, slot.store)
            if store.get(slot.name) is not slot.tensor:
                store[slot.name] = slot.tensor
                changes.append(f"{slot.label} was replaced by another tensor; the original was put back")
            t = slot.tensor
            if t.requires_grad != slot.requires_grad:
                t.requires_grad_(slot.requires_grad)
                changes.append(f"{slot.label}.requires_grad changed; set back to {slot.requires_grad}")
            copy = self.copies.get(id(t))
            if copy is not None:
                if not bit_equal(t, copy):
                    _write(t, copy)
                    changes.append(f"{slot.label} was modified in place; its values were restored")
            elif slot.version is not None and _version(t) != slot.version:
                changes.append(f"{slot.label} was written in place by the model's own forward while optimize() "
                               "ran it; no copy was taken, so it was not restored")
        return changes


def _write(t: torch.Tensor, values: torch.Tensor) -> None:
    with torch.inference_mode(), torch.no_grad():  # both: parameters that need grad, and inference tensors
        t.copy_(values)
