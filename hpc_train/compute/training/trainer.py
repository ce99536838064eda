"""The training loop every strategy and launcher shares.

`trainer.batch_size` is the global batch of one optimizer step: each of the W data-parallel
ranks gets batch_size / W samples. Rank 0 alone writes metrics.jsonl, summary.json and the
checkpoints, every `trainer.checkpoint_every` steps, when a stop signal arrives
(hpc_train.compute.runtime.interrupts) and at the end. :meth:`Trainer.fit` is the loop; everything
it calls is a named helper below it.
"""

from __future__ import annotations

import itertools
import logging
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from hpc_train.compute.checkpointing.checkpointer import Checkpointer
from hpc_train.compute.checkpointing.files import save_atomic
from hpc_train.compute.data.batch import to_device
from hpc_train.compute.data.epochs import Epoch, TrainEpochs
from hpc_train.compute.data.loaders import eval_loader, set_data_shard
from hpc_train.compute.parallel import build_strategy, rank_data_shard, replica_shard
from hpc_train.compute.parallel.base import TOKENS, StrategySetup
from hpc_train.compute.performance.meter import PerformanceMeter
from hpc_train.compute.replicas.group import ReplicaGroup
from hpc_train.compute.runtime import attempts, distributed, faults, heartbeat
from hpc_train.compute.runtime.garbage import settle_garbage_collector
from hpc_train.compute.runtime.interrupts import NONE, StopFlag, TrainingInterrupted
from hpc_train.compute.runtime.ranks import RankInfo
from hpc_train.compute.runtime.runlog import Progress, truncate_metrics
from hpc_train.compute.training import describe
from hpc_train.compute.training.activation_checkpointing import checkpoint_blocks
from hpc_train.compute.training.ema import WeightAverage
from hpc_train.compute.training.loggers import metrics_writer
from hpc_train.compute.training.optim import group_lrs, make_optimizer, make_schedule, param_groups, total_steps
from hpc_train.compute.training.replica_steps import ReplicaLoop
from hpc_train.compute.training.reproducible import parameter_digest, seed_everything
from hpc_train.compute.training.saves import Saves
from hpc_train.compute.training.settings import TrainingSettings
from hpc_train.compute.training.state import TrainState
from hpc_train.compute.training.summary import run_summary, seconds_per_step
from hpc_train.compute.training.throughput import Throughput
from hpc_train.compute.user.building import build_datasets, build_loss, build_model, check_fit, collate
from hpc_train.compute.user.step import build_step
from hpc_train.contracts.fingerprint import fingerprint
from hpc_train.contracts.strategy_table import KINDS
from hpc_train.records import hang, rundir
from hpc_train.records.performance import NUM_WORKERS, rates_note
from hpc_train.records.rank_errors import note_time_of_death, notes_time_of_death

log = logging.getLogger("hpc_train")
_END = object()  # the batches ran out


class Trainer:
    def __init__(
        self,
        settings: TrainingSettings,
        ranks: RankInfo,
        devices: List[torch.device],
        run_dir: Path,
        stop_flag: Optional[StopFlag] = None,
        replicas: Optional[ReplicaGroup] = None,
    ) -> None:
        self.settings, self.loop = settings, settings.trainer  # every section; the loop's own keys
        self.ranks, self.run_dir, self.stop_flag = ranks, run_dir, stop_flag
        # A replica group (fault_tolerance.replica_groups): its rank 0 writes the run's rows while it leads
        self.groups = ReplicaLoop(self, replicas) if replicas is not None else None
        self.metrics = metrics_writer(  # metrics.jsonl (+ the trackers the logger picks: the first group's alone)
            settings.logger,
            run_dir,
            self.is_main,
            settings.job_spec,
            settings.backend.slurm_job,
            restarted=self.groups is not None and self.groups.restarted,
        )
        self.state = TrainState()
        self.resumed_from_step: Optional[int] = None
        seed = int(settings.run.seed)
        seed_everything(seed)  # identical initial weights on every rank
        shard = rank_data_shard(settings.job.layout, ranks)  # (rank, size) of this rank's data, as the layout says
        self._build_data(replica_shard(shard, ranks), shard)  # a replica group reads its share of the job's data
        self._build_model(devices, shard)  # self.strategy, built complete around the user's step; the model it wraps
        self._build_optimizer()
        seed_everything(seed + ranks.global_rank)  # per-rank streams from here on (dropout, augmentation)
        self.checkpointer = self._make_checkpointer()
        self.saves = Saves(
            self.checkpointer, self.metrics, ranks.is_main, settings.backend.slurm_job, settings.launcher.signal_delay_s
        )
        self._begin_attempt()
        self._build_meters(devices)
        self._settled = False  # the strategy settled on the first batch of this attempt (_settle_once)
        self._flush_owed = False  # a checkpoint was written before its step's rows could be flushed
        self._rates = ""  # the progress line's throughput, from the last logged step

    def _build_optimizer(self) -> None:
        """The optimizer and its LR schedule, the gradient scaler, clipping, accumulation, the weight average."""
        optim, model = self.settings.optim, self.strategy.unwrap(self.wrapped)
        self.optimizer = make_optimizer(optim, param_groups(optim, model))
        self.scheduler = make_schedule(optim, self.optimizer, self.total_steps)
        self.scaler = self.strategy.make_grad_scaler()
        self.grad_clip: Optional[float] = optim.grad_clip  # null: gradients are not clipped
        self.accum_steps = int(optim.grad_accum_steps)  # micro-batches per optimizer step
        self.ema = WeightAverage(model, float(optim.ema_decay)) if optim.ema_decay is not None else None

    def _make_checkpointer(self) -> Checkpointer:
        """The checkpointer of the run's state: sharded (torch.distributed.checkpoint) where the strategy shards it."""
        settings, strategy = self.settings, self.strategy
        if strategy.sharded_checkpoints:
            # torch.distributed.checkpoint costs ~1 s to import: only strategies with sharded checkpoints pay it
            from hpc_train.compute.checkpointing.sharded import ShardedCheckpointer as checkpointer
        else:
            checkpointer = Checkpointer
        any_world = KINDS[settings.job.layout.strategy].any_world
        return checkpointer(
            self.run_dir,
            self.ranks,
            fingerprint(settings.job_spec, self.ranks.world_size, strategy.sharded_checkpoints, any_world=any_world),
            sharded={
                "model": strategy.unwrap(self.wrapped),
                "optimizer": self.optimizer,
                "scaler": self.scaler,
                "ema": self.ema,
            },
            shared={"scheduler": self.scheduler, "state": self.state, **self._group_state()},
            per_rank={"data": self.epochs.loader} if self.epochs.exact_resume else {},
            shard_key=strategy.checkpoint_key,
            owns_shard=strategy.owns_checkpoint_shard,
            settings=settings.checkpointing,
            resume=str(settings.run.resume),
        )

    def _begin_attempt(self) -> None:
        """Resume from the newest checkpoint, and record the attempt's start (the main rank). A restarted replica group
        does neither: it rejoins from a live group, not from disk."""
        restarted = self.groups is not None and self.groups.restarted
        if not restarted:
            self._resume()
        fresh = str(self.settings.run.resume) == "never"
        self.attempt = (
            attempts.begin(self.run_dir, fresh=fresh, resumed_from_step=self.resumed_from_step)
            if self.is_main and not restarted
            else 0
        )

    def _build_meters(self, devices: List[torch.device]) -> None:
        """Throughput from the restored position; FLOPs and MFU, the steps' phases, peak memory, profiles."""
        self.meter = Throughput(
            self.state.global_step,
            self.total_steps,
            int(self.loop.throughput_warmup_steps),
            int(self.loop.batch_size),
            self._sync,
        )
        self.perf = PerformanceMeter(
            self.loop.profile,
            self.settings.peak_tflops,
            str(self.loop.precision),
            self.ranks,
            devices,
            self.run_dir,
            first_timed_step=self.meter.warmup + 1,
        )

    @property
    def is_main(self) -> bool:
        """This rank writes the run's rows, summary and attempts: rank 0, of the leading replica group if any."""
        return self.ranks.is_main and (self.groups is None or self.groups.leads)

    @property
    def writes_checkpoints(self) -> bool:
        """Every rank of the leading replica group (all ranks without groups) writes the run's checkpoints."""
        return self.groups is None or self.groups.leads

    def _group_state(self) -> Dict[str, Any]:
        return {"replicas": self.groups.checkpointed()} if self.groups is not None else {}

    # -- the loop -------------------------------------------------------------------------
    def fit(self) -> Dict[str, Any]:
        """Train from the restored position (or the start) to the last step; the run's summary."""
        state, loop = self.state, self.loop
        if describe.already_complete(self.run_dir, self.resumed_from_step, self.state.global_step, self.total_steps):
            return rundir.read_summary(self.run_dir) or {}
        describe.announce(self)
        progress = Progress(
            self.total_steps, self.is_main and bool(loop.progress), int(loop.log_every), start=state.global_step
        )
        meter = self.meter
        self.model.train()
        settle_garbage_collector()
        if self.groups is not None:
            self.groups.connect()  # the lighthouse; the attempt's groups start together
        try:
            self._train_steps(progress, meter)
        except BaseException:
            self.checkpointer.finish_on_failure()  # a save still being written in the background may finish
            self.perf.finish()  # a profile of the steps so far is written
            raise
        self.perf.finish()
        progress.close()
        self._sync()
        meter.pause()  # the throughput of the training steps: the final checkpoint and the summary excluded
        if self.writes_checkpoints:
            self.saves.save(state.global_step, "end of training", settle=True)
        if self.groups is not None:
            self.groups.finished()
        return self._finish(meter)

    def _train_steps(self, progress: Progress, meter: Throughput) -> None:
        """The loop: from the restored position to the last step (evaluations and checkpoints when due)."""
        state = self.state
        while state.global_step < self.total_steps:
            epoch = self.epochs.open(state.epoch, state.step_in_epoch)  # from the position: mid-epoch after a resume
            moved = False  # this replica group took a live group's state: its data re-opens at that position
            for batch in self._marked(epoch):  # this rank's progress marked: waiting for data, then the step
                self._flush_owed_rows()  # the previous step's epoch did not end: no row more at its step
                faults.maybe_fail(self.ranks.global_rank, state.global_step)  # a failure injected by HPC_TRAIN_FAIL_AT
                faults.maybe_kill(self.ranks.global_rank, state.global_step)  # ... by HPC_TRAIN_KILL_AT
                self._settle_once(batch)
                final = state.global_step + 1 >= self.total_steps
                logged = self._log_due(final)
                taken = self.train_step(batch, logged) if self.groups is None else self.groups.take_step(batch, logged)
                if taken is None:
                    moved = True
                    break
                loss, metrics, grad_norm = taken
                state.step_taken()
                meter.step_done(state.global_step, metrics.get(TOKENS))
                if logged:
                    self._log_train(loss, metrics, grad_norm)
                progress.update(state.global_step, state.last_loss, self._rates)
                if self._evaluation_due(final):  # every trainer.eval_every steps, before that step's checkpoint
                    self._evaluate_between_steps()
                if final:
                    break
                self._after_step()  # checkpoint when due; after a stop signal, checkpoint and stop
            if not moved:
                self._end_epoch(epoch)  # when it ended, or at the last step: evaluate if due; count it if it ended

    @notes_time_of_death
    def train_step(self, batch: Any, logged: bool = True) -> Tuple[torch.Tensor, Dict[str, torch.Tensor], Any]:
        """One optimizer step over `batch` (cut into trainer.grad_accum_steps micro-batches); the loss, the step's
        metrics and the gradients' total norm before clipping (computed when clipping or when `logged`)."""
        self.optimizer.zero_grad(set_to_none=True)
        step = self.state.global_step + 1
        # The step whose FLOPs are counted runs the eager model, even under trainer.compile.
        model = self.wrapped if self.perf.flops.due else self.model
        with self.perf.forward_backward(step):
            faults.maybe_out_of_memory(self.ranks.global_rank, step - 1)
            loss, metrics = self.strategy.accumulate(model, self._to_device(batch), self.scaler, self.accum_steps)
            if self.groups is not None:  # over the live replica groups; raises StepNotCommitted unless all agreed
                loss = self.groups.average_and_commit(loss)
        heartbeat.mark(hang.OPTIMIZER)
        with self.perf.phase("optimizer"):
            grad_norm = self._optimizer_step(logged)
        return loss, metrics, grad_norm

    def _optimizer_step(self, logged: bool) -> Any:
        grad_norm = None
        if self.grad_clip is not None or logged:
            if self.scaler is not None:  # the norm and the clip threshold are about the true gradients
                self.scaler.unscale_(self.optimizer)
            grad_norm = self.strategy.grad_norm(self.model, self.grad_clip)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        if self.ema is not None:
            self.ema.update()
        return grad_norm

    @torch.no_grad()
    def evaluate(self) -> Dict[str, Optional[float]]:
        """The step's loss and metrics over data.val, weighted by batch size; accuracy for the built-in step's
        class logits against integer labels."""
        self.model.eval()
        results = self.strategy.evaluate(self.model, self._eval_batches())
        self.model.train()
        return results

    def _eval_batches(self) -> Iterator[Any]:
        """This rank's evaluation batches on the input device, each one marked as this rank's progress."""
        limit = self.loop.eval_batches  # the same first N batches every time: a fixed subset
        for index, batch in enumerate(itertools.islice(self.eval_loader, None if limit is None else int(limit))):
            heartbeat.mark(hang.EVAL, detail=f"batch {index + 1}")
            yield self._to_device(batch)

    # -- set-up -----------------------------------------------------------------------------
    def _build_data(self, shard: Tuple[int, int], eval_shard: Tuple[int, int]) -> None:
        """The data of this rank's `shard`; evaluation of `eval_shard` (each replica group evaluates all data.val)."""
        dp_rank, dp_size = shard
        set_data_shard(dp_rank, dp_size)  # before the datasets are built: a stream shards itself by it
        settings = self.settings.data
        data = self.data = build_datasets(settings)
        self.per_rank_batch = int(self.loop.batch_size) // dp_size
        self.epochs = TrainEpochs(
            data.train,
            settings,
            self.per_rank_batch,
            dp_size,
            dp_rank,
            int(self.settings.run.seed),
            data.collate_fn,
            global_batch=self.loop.batch_size,
        )
        self.eval_loader = (
            eval_loader(
                data.val, settings, self.per_rank_batch, eval_shard[1], eval_shard[0], collate_fn=data.collate_fn
            )
            if data.val is not None
            else None
        )
        steps_per_epoch = self.epochs.steps_per_epoch
        self.total_steps = (
            total_steps(self.loop.epochs, self.loop.max_steps, steps_per_epoch)
            if steps_per_epoch
            else self.epochs.steps_without_length(self.loop.max_steps, self.loop.epochs)
        )

    def _build_model(self, devices: List[torch.device], shard: Tuple[int, int]) -> None:
        """The user's model, loss and step; the strategy that runs that step (self.strategy, complete, placed as
        `shard` says); the model placed and wrapped by it."""
        loop = self.loop
        model = build_model(self.settings.run.model)
        loss_fn = build_loss(loop.loss)
        step = build_step(loop.step, loss_fn)
        # One tiny batch through the step: a dataset the model cannot take is refused before any training step.
        metric_names = check_fit(model, step, loss_fn, self.data)
        strategy = self.settings.strategy
        setup = StrategySetup(
            strategy,
            self.ranks,
            devices,
            str(loop.precision),
            bool(loop.compile),
            loss_fn,
            step,
            metric_names,
            self.settings.job.layout,
        )
        self.strategy = build_strategy(setup, shard)
        if loop.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if str(loop.activation_checkpointing) == "blocks":
            log.info("activation checkpointing: %s", checkpoint_blocks(model))
        example = None
        if self.strategy.needs_example:  # decoding a batch costs time on image folders: only when asked
            example = collate(self.data, self.per_rank_batch)[0]
        self.model = self.wrapped = self.strategy.wrap(model, example)
        if loop.compile and self.strategy.supports_compile:
            self.model = torch.compile(self.model)
        elif loop.compile and not self.strategy.compiled_blocks:
            log.warning("trainer.compile is ignored for %s: its schedule runs the stage module itself", strategy.name)

    def _resume(self) -> None:
        path, payload = self.checkpointer.find()
        if payload is None:
            return
        self.checkpointer.restore(payload)  # weights, optimizer, schedule, position, this rank's RNG
        self.resumed_from_step = self.state.global_step
        log.info(
            "resumed from %s: epoch %d, step %d of %d", path, self.state.epoch, self.state.global_step, self.total_steps
        )
        self.epochs.resume_at(self.state.epoch, self.state.step_in_epoch, bool(self.checkpointer.resharded_from))
        if self.is_main:  # drop lines the lost attempt logged past the checkpoint
            # An epoch that was complete at the checkpoint is evaluated again after the resume (a stream without a
            # length cannot tell whether it was: it re-evaluates in that case too).
            # With trainer.eval_every, an evaluation at the checkpoint's step ran before the checkpoint: kept.
            mid_epoch = self.epochs.inside_epoch(self.state.step_in_epoch)
            keep_eval = mid_epoch or self.loop.eval_every is not None
            truncate_metrics(self.run_dir, self.state.global_step, keep_eval_at_last=keep_eval)

    # -- inside the loop --------------------------------------------------------------------
    def _settle_once(self, batch: Any) -> None:
        """Before the first step of every attempt: every attempt's steps run on the same DDP buckets (see
        DDPStrategy.settle)."""
        if not self._settled:
            self.strategy.settle(self.model, self._to_device(batch))
            self._settled = True

    def _log_due(self, final: bool) -> bool:
        """trainer.log_every=N: after every N-th optimizer step and after the last one."""
        return final or (self.state.global_step + 1) % int(self.loop.log_every) == 0

    def _end_epoch(self, epoch: Epoch) -> None:
        """After an epoch's batches (all of them, or up to the last step): with trainer.eval_every=null, evaluate;
        when the epoch ended, the next one starts at its step 0."""
        ended = epoch.ended(self.state.step_in_epoch)
        if self._evaluation_due_at_epoch_end(ended):
            self._evaluate_between_steps()
        self._flush_owed_rows()
        if ended:
            self.state.next_epoch()

    def _to_device(self, batch: Any) -> Any:
        return to_device(batch, self.strategy.input_device, bool(self.loop.channels_last))

    def _log_train(self, loss: torch.Tensor, metrics: Dict[str, torch.Tensor], grad_norm: Any) -> None:
        state = self.state
        state.last_loss = self.strategy.global_loss(loss)  # a collective on some strategies: every rank calls it
        state.last_metrics = self.strategy.global_metrics(metrics)
        record: Dict[str, Any] = {
            "kind": "train",
            "step": state.global_step,
            "epoch": state.epoch,
            "loss": state.last_loss,
            **state.last_metrics,
            **group_lrs(self.optimizer),
        }
        if grad_norm is not None:
            record["grad_norm"] = float(grad_norm)
        elapsed = self.meter.elapsed  # one reading for every rate of the row
        if self.meter.samples:
            record["samples_per_sec"] = self.meter.rate(self.meter.samples, elapsed)
        if TOKENS in self.strategy.metric_names:
            record["tokens_per_sec"] = self.meter.rate(self._global_tokens(), elapsed)
        record.update(self.perf.window_fields())  # a collective: every rank calls it
        self._rates = rates_note(record)
        record["time"] = time.time()
        self.metrics.write(record)

    def _global_tokens(self) -> float:
        """Tokens of the timed steps over every rank (a collective: every rank calls it)."""
        local = self.meter.tokens if self.meter.tokens is not None else torch.zeros((), dtype=torch.float64)
        device = distributed.collective_device(self.strategy.input_device)
        tokens = float(distributed.all_reduce_sum(local.reshape(1).to(device)).item())
        return tokens * (self.groups.live if self.groups is not None else 1)  # a group's tokens x the live groups

    # -- evaluation -------------------------------------------------------------------------
    def _evaluation_due(self, final: bool) -> bool:
        """trainer.eval_every=N: after every N-th optimizer step and after the last one."""
        every = self.loop.eval_every
        if every is None or not self.loop.eval or self.eval_loader is None:
            return False
        return final or (self.state.global_step % int(every) == 0)

    def _evaluation_due_at_epoch_end(self, epoch_done: bool) -> bool:
        """trainer.eval_every=null: after every epoch, and after the last step when it ends mid-epoch."""
        if self.loop.eval_every is not None or not self.loop.eval or self.eval_loader is None:
            return False
        return epoch_done or self.state.global_step >= self.total_steps

    def _evaluate_between_steps(self) -> None:
        """Evaluate and log, outside the throughput measurement."""
        with self.perf.excluded():
            self._sync()
            self.meter.pause()
            self._evaluate_and_log()
            self.meter.resume(self.state.global_step)

    def _evaluate_and_log(self) -> None:
        state = self.state
        results = self.evaluate()
        if self.ema is not None:  # the averaged weights on the same batches
            with self.ema.swapped_in():
                averaged = self.evaluate()
            results.update({f"{name}_ema": value for name, value in averaged.items() if name != "samples"})
        state.last_eval = results
        accuracy, loss = results["accuracy"], results["loss"]
        self.metrics.write(
            {
                "kind": "eval",
                "step": state.global_step,
                "epoch": state.epoch,
                "accuracy": accuracy,
                "loss": loss,
                "samples": results["samples"],
                **{name: value for name, value in results.items() if name not in ("accuracy", "loss", "samples")},
                "time": time.time(),
            }
        )
        log.info(
            "epoch %d step %d: eval %seval loss %.4f%s",
            state.epoch,
            state.global_step,
            "" if accuracy is None else f"accuracy {accuracy:.4f}, ",
            loss,
            "" if self.ema is None else f" (weight average: {results['loss_ema']:.4f})",
        )

    @notes_time_of_death
    def _after_step(self) -> None:
        """Checkpoint when due; stop (after a checkpoint) when any rank got a stop signal."""
        step = self.state.global_step
        faults.step_sleep(step, resumed=self.resumed_from_step is not None)
        with self.perf.phase("checkpoint"):
            if self.writes_checkpoints:
                self.saves.after_step(step, self._flush_before_checkpoint)
        if self.stop_flag is None:
            return
        request = self.stop_flag.agreed() if self.ranks.is_distributed else self.stop_flag.request
        if request != NONE:
            self._flush_owed = False
            self.metrics.flush()  # nothing more is logged in this attempt
            if self.writes_checkpoints:
                self.saves.save(step, "stop signal", settle=True)
            reason = self.stop_flag.reason(request, float(self.settings.launcher.signal_delay_s))
            raise TrainingInterrupted(request, step, reason, self.stop_flag)

    def _flush_before_checkpoint(self) -> None:
        """The trackers write out every row up to this step before its checkpoint exists, so that what a checkpoint
        covers is in them after a kill -9 too. When an epoch-end evaluation may still log at this step (a tracker
        takes no row at a step it has flushed: W&B), the flush waits until it has, or until the next step starts."""
        if self.epochs.inside_epoch(self.state.step_in_epoch) or not self._evaluation_due_at_epoch_end(True):
            self.metrics.flush()
        else:
            self._flush_owed = True

    def _flush_owed_rows(self) -> None:
        if self._flush_owed:
            self._flush_owed = False
            self.metrics.flush()

    def _marked(self, batches: Iterator[Any]) -> Iterator[Any]:
        """The batches, with this rank's progress marked: waiting for data, then each step's duration."""
        batches = iter(batches)
        started = None
        while True:
            if started is not None:
                heartbeat.step_ended(time.perf_counter() - started)
            heartbeat.mark(hang.DATA, self.state.global_step + 1)
            self.perf.step_boundary(self.state.global_step + 1)
            started = time.perf_counter()
            try:
                with self.perf.phase("data"):
                    batch = next(batches, _END)
            except BaseException as error:  # the dataset's own exception, before the iterator's workers are closed
                note_time_of_death(error)
                raise
            if batch is _END:
                return
            yield batch

    def _sync(self) -> None:
        if self.strategy.input_device.type == "cuda":
            torch.cuda.synchronize(self.strategy.input_device)

    # -- before and after -------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return describe.model_name(self.settings)

    @property
    def data_name(self) -> str:
        return describe.data_name(self.settings)

    def _finish(self, meter: Throughput) -> Dict[str, Any]:
        """Final weights (every parameter owner), parameter digest (every rank) and summary.json (rank 0)."""
        state = self.state
        batch = int(self.loop.batch_size)
        identity = {
            "strategy": self.settings.strategy.name,
            "model": self.model_name,
            "data": self.data_name,
            "world_size": self.ranks.global_world,  # every rank of every replica group
            "data_parallel_size": self.strategy.data_parallel_size * self.ranks.groups,
            "global_batch": batch,
            "precision": self.loop.precision,
            "device": str(self.strategy.input_device.type),
            NUM_WORKERS: int(self.settings.data.num_workers),
        }
        summary = run_summary(
            identity,
            state,
            self.strategy.metric_names,
            describe.ema_summary(self.ema, self.state.last_eval, self.strategy.metric_names),
            meter,
            meter.rate(self._global_tokens()) if TOKENS in self.strategy.metric_names else None,
            batch,
            self.perf.summary_fields(seconds_per_step(meter, batch)),  # a collective: every rank calls it
            {
                "resumed_from_step": self.resumed_from_step,
                "checkpoint_blocked_s": round(self.saves.blocked_s, 6),
                "attempts": self.attempt,
                **(self.groups.summary_fields() if self.groups is not None else {}),
            },
        )
        weights = self.strategy.final_state_dict(self.wrapped)  # a collective for fsdp (gathered on rank 0)
        if weights:
            log.info("final parameter digest %s", parameter_digest(weights))
        weights_name = self.strategy.weights_file()
        if weights_name and self.writes_checkpoints:
            save_atomic(weights, self.run_dir / weights_name, f"the final weights {weights_name}")
        if self.is_main:
            rundir.write_summary(self.run_dir, summary)
        self.metrics.close()
        return summary
