"""One process on the CPU or one GPU: plain module, torch autocast and GradScaler."""

from __future__ import annotations

import contextlib
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
from normlab.launch.engines.base import Engine, OptimizerFactory, StepVeto
from normlab.launch.engines.construct import build_on_meta, materialize
from normlab.launch.engines.transforms import apply_transforms
from normlab.launch.errors import CheckpointError
from normlab.model import ModelConfig
from torch import nn

AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
MODEL_FILE, OPTIM_FILE, ENGINE_FILE, TRAINER_FILE = (
    "model.pt",
    "optim.pt",
    "engine.pt",
    "trainer.pt",
)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        from normlab.launch.errors import ConfigError

        raise ConfigError("training.device is 'cuda' but no CUDA device is available")
    return torch.device(name)


class SingleEngine(Engine):
    name = "single"

    def setup(self, model_cfg: ModelConfig, build_optimizer: OptimizerFactory) -> None:
        self._device = resolve_device(self.run.device)
        module, plan = build_on_meta(model_cfg)  # allocated once, on the device
        self._model: nn.Module = apply_transforms(
            module, self.section, self.precision.fp8, self._device.type,
            smooth=model_cfg.smooth_swiglu, whole_model=self.section.compile_scope == "model",
        )  # fmt: skip
        materialize(module, plan, self.run.seed, self._device)
        self._module = module
        self._optimizer = build_optimizer(module)
        prec = self.precision
        self._amp_dtype = AMP_DTYPES.get(prec.dtype)
        self._scaler = torch.amp.GradScaler(
            self._device.type,
            init_scale=prec.loss_scale_init,
            growth_interval=prec.loss_scale_growth_interval,
            enabled=prec.dtype == "fp16",
        )

    def _autocast(self) -> contextlib.AbstractContextManager:
        if self._amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self._device.type, dtype=self._amp_dtype)

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with self._autocast():
            return self._model(inputs)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = self._loss(inputs, targets)
        self._scaler.scale(loss / self.run.grad_accum).backward()
        return loss.detach()

    def clip_and_step(
        self, max_norm: float, veto: StepVeto | None = None
    ) -> tuple[torch.Tensor, bool]:
        self._scaler.unscale_(self._optimizer)
        params = [p for p in self._module.parameters() if p.grad is not None]
        limit = max_norm if max_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(params, limit, foreach=True)
        skipped = veto is not None and veto(grad_norm)
        if skipped:
            self._scaler.update()  # keeps the scaler's per-step bookkeeping consistent
        else:
            self._scaler.step(self._optimizer)
            self._scaler.update()
        return grad_norm.detach(), skipped

    def zero_grad(self) -> None:
        self._optimizer.zero_grad(set_to_none=True)

    def save(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> None:
        torch.save(self._module.state_dict(), ckpt_dir / MODEL_FILE)
        torch.save(self._optimizer.state_dict(), ckpt_dir / OPTIM_FILE)
        torch.save({"scaler": self._scaler.state_dict()}, ckpt_dir / ENGINE_FILE)
        torch.save(extra_state, ckpt_dir / TRAINER_FILE)

    def load(self, ckpt_dir: Path) -> dict[str, Any]:
        model_sd = read_file(ckpt_dir / MODEL_FILE, weights_only=True)
        check_compatible(self._module.state_dict(), model_sd, ckpt_dir)
        optim_sd = read_file(ckpt_dir / OPTIM_FILE, weights_only=True)
        engine_sd = read_file(ckpt_dir / ENGINE_FILE, weights_only=True)
        extra = read_file(ckpt_dir / TRAINER_FILE, weights_only=False)
        self._module.load_state_dict(model_sd)
        try:
            self._optimizer.load_state_dict(optim_sd)
        except (ValueError, KeyError, RuntimeError) as exc:
            raise CheckpointError(
                f"{ckpt_dir / OPTIM_FILE}: optimizer state does not fit: {exc}"
            ) from None
        if engine_sd.get("scaler"):
            self._scaler.load_state_dict(engine_sd["scaler"])
        return extra


def read_file(path: Path, *, weights_only: bool) -> Any:
    """torch.load with the ways a checkpoint file can be damaged turned into CheckpointError."""
    if not path.is_file():
        raise CheckpointError(f"checkpoint file missing: {path}")
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise CheckpointError(f"checkpoint file {path} is truncated or corrupt ({msg})") from None


def check_compatible(expected: dict[str, torch.Tensor], found: dict[str, Any], where: Path) -> None:
    """Name the first differences between the configured model and the checkpoint's tensors."""
    problems = [f"missing {k}" for k in expected if k not in found]
    problems += [f"unexpected {k}" for k in found if k not in expected]
    problems += [
        f"{k}: checkpoint {tuple(found[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if k in found and tuple(found[k].shape) != tuple(v.shape)
    ]
    if problems:
        shown = "; ".join(problems[:3]) + (
            f"; ... {len(problems) - 3} more" if len(problems) > 3 else ""
        )
        raise CheckpointError(
            f"checkpoint {where} does not match the configured architecture: {shown}"
        )
