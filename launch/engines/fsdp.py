"""FSDP2 engine: `fully_shard` on every block and on the root, checkpoints through DCP.

Wrapping follows torchtitan's order (activation checkpointing, then per-block compile, then
sharding): Zhao et al. 2023, "PyTorch FSDP", with the per-parameter DTensor sharding of FSDP2.
The model is built on the meta device, sharded, then each rank materialises and initialises only
its shards (launch/engines/construct.py), drawing the same values one process would draw.
`engine.replicate: R` shards within groups of world/R ranks and replicates across the R groups
(HSDP on a 2-D device mesh: shard inside a node, replicate across nodes).

Checkpoints hold the model and optimizer as a torch.distributed.checkpoint directory keyed by
parameter name (loadable on any world size) plus one `trainer_rank{r}.pt` per rank (loader
position, RNG states, callback state).
"""

from __future__ import annotations

import json
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from normlab.launch.engines.base import OptimizerFactory, StepVeto
from normlab.launch.engines.construct import build_on_meta, materialize
from normlab.launch.engines.dist import DistributedEngine
from normlab.launch.engines.single import read_file
from normlab.launch.engines.transforms import apply_transforms
from normlab.launch.errors import CheckpointError, ConfigError
from normlab.model import ModelConfig, Transformer
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.distributed.tensor import DeviceMesh, DTensor, init_device_mesh

DCP_DIR, META_FILE = "dcp", "engine.json"
LOW_PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}  # the compute dtype of a shard


def trainer_file(rank: int) -> str:
    return f"trainer_rank{rank}.pt"


def read_meta(ckpt_dir: Path) -> dict[str, Any]:
    """engine.json of a sharded checkpoint ({} for a single-engine checkpoint)."""
    path = ckpt_dir / META_FILE
    if not path.is_file():
        return {}
    from normlab.launch.json_file import read_json

    meta = read_json(path, "checkpoint's engine record", CheckpointError)
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} is damaged: a {type(meta).__name__}, not an object")
    return meta


def read_extra(ckpt_dir: Path, rank: int) -> dict[str, Any]:
    """This rank's trainer state; a rank the saving run did not have takes rank 0's."""
    path = ckpt_dir / trainer_file(rank)
    return read_file(path if path.is_file() else ckpt_dir / trainer_file(0), weights_only=False)


def device_mesh(device_type: str, world: int, replicate: int) -> DeviceMesh:
    """1-D mesh of all ranks (FSDP), or (replicate, shard) for HSDP."""
    if replicate < 1 or world % replicate:
        raise ConfigError(
            f"engine.replicate ({replicate}) must divide the world size ({world}): allowed "
            f"{[r for r in range(1, world + 1) if world % r == 0]}"
        )
    if replicate == 1:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    shape = (replicate, world // replicate)
    return init_device_mesh(device_type, shape, mesh_dim_names=("replicate", "shard"))


class FSDPEngine(DistributedEngine):
    name = "fsdp"

    def setup(self, model_cfg: ModelConfig, build_optimizer: OptimizerFactory) -> None:
        self._device = self._join()
        self._mesh = device_mesh(self._device.type, self._world, self.section.replicate)
        module, plan = build_on_meta(model_cfg)
        # torchtitan's order: FP8 conversion, activation checkpointing, compile, sharding
        apply_transforms(
            module, self.section, self.precision.fp8, self._device.type,
            smooth=model_cfg.smooth_swiglu, fsdp=True,
        )  # fmt: skip
        self._shard(module)
        materialize(module, plan, self.run.seed, self._device)
        # asynchronous saves talk over their own CPU group (a collective call on every rank)
        self._io_group = dist.new_group(backend="gloo") if self.run.async_checkpoint else None
        self._module = module
        self._optimizer = build_optimizer(module)
        self._micro = 0
        prec = self.precision
        # fp16: dynamic loss scaling whose inf/NaN check is agreed over every rank's shards
        self._scaler = ShardedGradScaler(
            self._device.type,
            init_scale=prec.loss_scale_init,
            growth_interval=prec.loss_scale_growth_interval,
            enabled=prec.dtype == "fp16",
        )

    def _shard(self, module: Transformer) -> None:
        low = LOW_PRECISION.get(self.precision.dtype)  # fp32 master shards either way
        policy = (
            MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32)
            if low is not None
            else MixedPrecisionPolicy()
        )
        n = len(module.blocks)
        for i, block in enumerate(module.blocks):
            # the last block is gathered again at once by the backward: keep it unsharded
            fully_shard(block, mesh=self._mesh, mp_policy=policy, reshard_after_forward=i < n - 1)
        fully_shard(module, mesh=self._mesh, mp_policy=policy)

    def wrap_like_model(self, module: nn.Module) -> nn.Module:
        fully_shard(module.to(self._device), mesh=self._mesh)
        return module

    def _forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self._module(inputs)

    def forward_backward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        accum = self.run.grad_accum
        self._micro += 1
        assert isinstance(self._module, FSDPModule)
        # engine.grad_sync: reduce-scatter after every micro-batch (each rank keeps only its fp32
        # gradient shard) or once, after the last (the whole unsharded gradient meanwhile)
        every = self.section.grad_sync == "micro_batch"
        self._module.set_requires_gradient_sync(every or self._micro >= accum)
        loss = self._loss(inputs, targets)
        self._scaler.scale(loss / accum).backward()
        return self.all_reduce(loss.detach(), "mean")  # the global-batch loss, as one process

    def clip_and_step(
        self, max_norm: float, veto: StepVeto | None = None
    ) -> tuple[torch.Tensor, bool]:
        self._scaler.unscale_(self._optimizer)  # a no-op outside fp16
        params = [p for p in self._module.parameters() if p.grad is not None]
        grads = [p.grad for p in params]
        norm = torch.nn.utils.get_total_norm(grads, foreach=True)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # the global norm over every shard
        if max_norm > 0:
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm, foreach=True)
        skipped = veto is not None and veto(norm)
        if veto is not None:  # every rank must take the same decision
            flag = self.all_reduce(torch.tensor(float(skipped), device=self._device), "max")
            skipped = bool(flag.item())
        if not skipped:
            self._scaler.step(self._optimizer)  # fp16: skips the update on inf/NaN gradients
        self._scaler.update()
        return norm.detach(), skipped

    def zero_grad(self) -> None:
        self._micro = 0
        self._optimizer.zero_grad(set_to_none=True)

    # --- checkpoints --------------------------------------------------------------------------
    def save(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> None:
        model_sd, optim_sd = get_state_dict(self._module, self._optimizer)
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=ckpt_dir / DCP_DIR)
        self._save_small_files(ckpt_dir, extra_state)

    def save_async(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> Future[Any]:
        """DCP's async_save: the state is copied to host memory here, written by a thread over a
        gloo group of its own (its collectives never interleave with training's). The small
        files go first, so the future's completion on rank 0 (DCP writes its metadata only after
        every rank's data) means the whole checkpoint is on disk."""
        self._save_small_files(ckpt_dir, extra_state)
        model_sd, optim_sd = get_state_dict(self._module, self._optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        return dcp.async_save(state, checkpoint_id=ckpt_dir / DCP_DIR, process_group=self._io_group)

    def _save_small_files(self, ckpt_dir: Path, extra_state: dict[str, Any]) -> None:
        torch.save(extra_state, ckpt_dir / trainer_file(self._rank))
        if self.is_main:
            meta = {
                "engine": self.name,
                "world_size": self._world,
                "replicate": self.section.replicate,
                "format": "dcp",
                "scaler": self._scaler.state_dict(),  # {} outside fp16; the same on every rank
            }
            (ckpt_dir / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")

    def load(self, ckpt_dir: Path) -> dict[str, Any]:
        meta = read_meta(ckpt_dir)
        if meta.get("format") != "dcp" or not (ckpt_dir / DCP_DIR).is_dir():
            raise CheckpointError(
                f"checkpoint {ckpt_dir} was not written by engine fsdp (engine "
                f"{meta.get('engine', 'single')!r}); resume it with that engine, or start from "
                "its weights via `normlab export`"
            )
        model_sd, optim_sd = get_state_dict(self._module, self._optimizer)
        state = {"model": model_sd, "optim": optim_sd}
        try:
            dcp.load(state, checkpoint_id=ckpt_dir / DCP_DIR)
        except (RuntimeError, ValueError, KeyError) as exc:
            msg = str(exc).strip().splitlines()
            raise CheckpointError(
                f"cannot restore {ckpt_dir / DCP_DIR} into the configured model: "
                f"{msg[-1] if msg else type(exc).__name__}"
            ) from None
        set_state_dict(
            self._module,
            self._optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
        )
        if meta.get("scaler"):
            self._scaler.load_state_dict(meta["scaler"])
        return read_extra(ckpt_dir, self._rank)

    def release(self) -> None:
        for attr in ("_optimizer", "_module"):
            self.__dict__.pop(attr, None)
        mesh = self.__dict__.pop("_mesh", None)
        # DTensors that outlive the engine (held by callbacks, say) reach the process group
        # through their mesh; without this the group dies at interpreter exit (see shutdown)
        registry = getattr(mesh, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()
