"""DeepSpeed ZeRO engine (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models"), stages 1, 2 and 3.

The DeepSpeed JSON config is generated from the recipe (`ds_config`), with an optional user file
merged on top. The optimizer is the recipe's torch optimizer, handed to `deepspeed.initialize`
as an object: DeepSpeed never substitutes its own (no JIT-compiled CPUAdam/FusedAdam builds),
and there is no DeepSpeed scheduler because the trainer sets the recipe's learning rate itself.

A spike-policy veto needs the global gradient norm before the update. ZeRO computes that norm
inside its `step()` and then calls the wrapped torch optimizer's `step()`; the engine gates that
inner call, so a vetoed step leaves both the weights and the Adam moments untouched.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch
from normlab.launch.config import EngineSection, PrecisionSection
from normlab.launch.config.loader import deep_merge
from normlab.launch.engines.base import OptimizerFactory, RunFacts, StepVeto
from normlab.launch.engines.construct import build_on_meta, build_zero3, materialize
from normlab.launch.engines.deepspeed_muon import check_muon_config
from normlab.launch.engines.deepspeed_storage import DeepSpeedStorage
from normlab.launch.engines.deepspeed_universal import universal_dir, universal_load
from normlab.launch.engines.dist import DistributedEngine
from normlab.launch.engines.fsdp import (
    META_FILE,
    read_extra,
    read_meta,
    trainer_file,
)
from normlab.launch.engines.transforms import apply_transforms
from normlab.launch.errors import CheckpointError, ConfigError
from normlab.model import ModelConfig, Transformer

DS_TAG = "deepspeed"  # the sub-directory DeepSpeed writes inside a step directory
RECIPE_OWNED = ("optimizer", "scheduler")


def ds_config(
    section: EngineSection, prec: PrecisionSection, run: RunFacts, world_size: int
) -> dict[str, Any]:
    """The DeepSpeed config the recipe implies, with engine.deepspeed_config merged on top."""
    stage = section.zero_stage
    if stage not in (1, 2, 3):
        raise ConfigError(
            f"engine deepspeed needs engine.zero_stage 1, 2 or 3, got {stage} "
            "(stage 0 is plain data parallelism: use engine.name: fsdp)"
        )
    micro, accum = run.micro_batch, run.grad_accum
    out: dict[str, Any] = {
        "train_batch_size": micro * accum * world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": accum,
        "gradient_clipping": run.grad_clip,
        "zero_optimization": {"stage": stage},
        "zero_allow_untested_optimizer": True,  # the recipe's torch optimizer, by design
        "bf16": {"enabled": prec.dtype == "bf16"},
        "fp16": {
            "enabled": prec.dtype == "fp16",
            "loss_scale": 0,  # dynamic
            "initial_scale_power": round(math.log2(prec.loss_scale_init)),
            "loss_scale_window": prec.loss_scale_growth_interval,
        },
        "steps_per_print": 2**62,  # the trainer logs; keep DeepSpeed quiet
        "wall_clock_breakdown": False,
    }
    user = section.deepspeed_config
    merged = deep_merge(out, _user_config(user, out)) if user else out
    if run.optimizer == "muon":
        check_muon_config(merged)
    return merged


def _user_config(path: str, generated: dict[str, Any]) -> dict[str, Any]:
    from normlab.launch.json_file import read_json

    p = Path(path).expanduser()
    if not p.is_file():
        raise ConfigError(f"engine.deepspeed_config {path} does not exist")
    user = read_json(  # the one JSON reader: UTF-8, syntax, no key given twice
        p, "DeepSpeed config", lambda m: ConfigError(f"engine.deepspeed_config: {m}")
    )
    if not isinstance(user, dict):
        raise ConfigError(f"engine.deepspeed_config {path} must hold a JSON object")
    owned = [k for k in RECIPE_OWNED if k in user]
    if owned:
        raise ConfigError(
            f"engine.deepspeed_config {path} sets {owned}: the recipe's optim and schedule "
            "sections choose the optimizer and learning-rate schedule; remove these keys"
        )
    batch = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
    clash = [k for k in batch if k in user and user[k] != generated[k]]
    if clash:
        raise ConfigError(
            f"engine.deepspeed_config {path} sets {clash} differently from the recipe; set "
            "data.batch_size and training.grad_accum instead"
        )
    return user


def skip_shm_comm_build() -> None:
    """DeepSpeed's CPU accelerator JIT-compiles a shared-memory all-reduce extension on first use
    (about 50 s with no cache) and probes every op builder with compiler subprocesses. Mark the
    op incompatible (DeepSpeed keeps this dict for such edits): collectives then go through
    torch.distributed's gloo backend, which the process group already uses."""
    import deepspeed.ops

    compatible = vars(deepspeed.ops).setdefault("__compatible_ops__", {})
    compatible["deepspeed_shm_comm"] = False


class DeepSpeedEngine(DistributedEngine):
    name = "deepspeed"

    def setup(self, model_cfg: ModelConfig, build_optimizer: OptimizerFactory) -> None:
        self._device = self._join()
        config = ds_config(self.section, self.precision, self.run, self._world)
        if self._device.type == "cpu":  # skips DeepSpeed's accelerator probe and its warning
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
        import deepspeed  # heavy; only for this engine

        if self._device.type == "cpu":
            skip_shm_comm_build()
        deepspeed.init_distributed(dist_backend=torch.distributed.get_backend())
        self._config = config
        storage = DeepSpeedStorage(self.section.zero_stage, self._rank, self._world, config)
        self.storage = storage
        module = self._build(model_cfg, config)
        # precision.fp8 swaps the linear layers, keeping their (partitioned) parameters
        apply_transforms(
            module, self.section, self.precision.fp8, self._device.type,
            smooth=model_cfg.smooth_swiglu,
        )  # fmt: skip
        self._module = module
        self._optimizer = build_optimizer(module)
        self._gate_optimizer(self._optimizer)
        try:
            self._ds, *_ = deepspeed.initialize(
                model=module, optimizer=self._optimizer, config=config
            )
        except (AssertionError, ValueError) as exc:
            raise ConfigError(f"DeepSpeed rejected the generated config: {exc}") from None
        storage.attach(self._ds.optimizer, self._optimizer)  # Muon's partition layouts
        self._micro = 0

    def _build(self, model_cfg: ModelConfig, config: dict[str, Any]) -> Transformer:
        """ZeRO-3: constructed partitioned under zero.Init; ZeRO-1/2 keep whole weights on every
        rank, built on the meta device and drawn once on the device. Same values either way."""
        if self.section.zero_stage == 3:
            return build_zero3(model_cfg, self.run.seed, config)
        module, plan = build_on_meta(model_cfg)
        materialize(module, plan, self.run.seed, self._device)
        return module

    def _gate_optimizer(self, optimizer: torch.optim.Optimizer) -> None:
        """Run the torch optimizer's step only when the veto (asked once per step) allows it."""
        inner = optimizer.step
        self._veto: StepVeto | None = None
        self._decision: bool | None = None

        def gated_step(*args: Any, **kwargs: Any) -> Any:
            if self._veto is not None and self._decision is None:
                norm = torch.tensor(float(self._ds.optimizer._global_grad_norm))
                skip = float(self._veto(norm))
                flag = self.all_reduce(torch.tensor(skip, device=self._device), "max")
                self._decision = bool(flag.item())  # every rank takes the same decision
            return None if self._decision else inner(*args, **kwargs)

        optimizer.step = gated_step  # type: ignore[method-assign]

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._ds(inputs)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self._micro += 1
        self._ds.set_gradient_accumulation_boundary(self._micro >= self.run.grad_accum)
        loss = self._loss(inputs, targets)
        self._ds.backward(loss)  # divides by gradient_accumulation_steps, applies the loss scale
        return self.all_reduce(loss.detach(), "mean")

    def clip_and_step(
        self, max_norm: float, veto: StepVeto | None = None
    ) -> tuple[torch.Tensor, bool]:
        if max_norm != self.run.grad_clip:
            raise ValueError("DeepSpeed clips at the configured optim.grad_clip only")
        self._veto, self._decision = veto, None
        self._ds.step()  # norm, overflow check (fp16), clip, gated optimizer step
        norm = self._ds.get_global_grad_norm()
        skipped = bool(self._decision)
        self._veto, self._decision = None, None
        value = float("nan") if norm is None else float(norm)
        return torch.tensor(value, device=self._device), skipped

    def zero_grad(self) -> None:
        self._micro = 0
        self._ds.zero_grad()

    # --- checkpoints --------------------------------------------------------------------------
    def save(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> None:
        self._ds.save_checkpoint(str(ckpt_dir), tag=DS_TAG, save_latest=False)
        torch.save(extra_state, ckpt_dir / trainer_file(self._rank))
        if self.is_main:
            meta = {
                "engine": self.name,
                "world_size": self._world,
                "zero_stage": self.section.zero_stage,
                "format": "deepspeed",
                "tag": DS_TAG,
            }
            (ckpt_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def load(self, ckpt_dir: Path) -> dict[str, Any]:
        meta = read_meta(ckpt_dir)
        if meta.get("format") != "deepspeed":
            raise CheckpointError(
                f"checkpoint {ckpt_dir} was not written by engine deepspeed (engine "
                f"{meta.get('engine', 'single')!r}); resume it with that engine, or start from "
                "its weights via `normlab export`"
            )
        if meta.get("zero_stage") != self.section.zero_stage:
            raise CheckpointError(
                f"checkpoint {ckpt_dir} holds ZeRO-{meta.get('zero_stage')} shards; this run has "
                f"ZeRO-{self.section.zero_stage}: resume with engine.zero_stage="
                f"{meta.get('zero_stage')} (or export it)"
            )
        load_dir, universal = ckpt_dir, meta.get("world_size") != self._world
        if universal:  # another number of ranks: through DeepSpeed's universal checkpoint
            load_dir = universal_dir(ckpt_dir, DS_TAG, self.is_main, self.barrier)
        with universal_load(self._ds, self._optimizer, universal):
            path, _ = self._ds.load_checkpoint(
                str(load_dir),
                tag=DS_TAG,
                load_optimizer_states=True,
                load_lr_scheduler_states=False,
            )
        if path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint under {load_dir / DS_TAG}")
        return read_extra(ckpt_dir, self._rank)

    def release(self) -> None:
        ds = self.__dict__.pop("_ds", None)
        if ds is not None:
            ds.destroy()
        for attr in ("_optimizer", "_module"):
            self.__dict__.pop(attr, None)
