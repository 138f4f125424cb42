"""Each point's batch source as a visit opens it: built by the spec's kind (a
torchdata.nodes graph's by graph.py, a DataLoader's by sources.py) behind the user's
wrapper, loop stages and transfer, and its worker pool kept between visits (parked and
resumed). Apart from experiment.py as the one part of an experiment that holds processes
open; Experiment inherits it (PointSources reads the Experiment's fields).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterable, Iterator, Optional, Union

import torch
from torch.utils.data import DataLoader

from ..core import tree
from ..core.fixes import Variant
from ..pipeline import split
from ..pipeline.integrations import nodes, timm
from ..pipeline.loader import LoaderSpec
from . import graph, sources


class PointSources:
    """The points' sources of an Experiment: opened (`open`), kept (`keeps`, `parks`,
    `resumes`, `close_kept`) and built by the spec's kind (`_point_source`)."""

    @contextlib.contextmanager
    def open(self, name: str, spec: Optional[LoaderSpec] = None, epochs: bool = False,
             threads: Optional[int] = None, calls: Optional[list] = None, *,
             keep: Union[bool, str] = False, variant: Optional[Variant] = None) -> Iterator[tuple]:
        """The point's batch source, open: (next_batch, the transfer applied to each batch
        or None when the batches are already on the device). `spec`: other loader settings
        for `full` (verify.py, sweep.py); the user's own by default. `epochs`: `full` ends
        its epochs as the user's loop does (sources.full_loader). `threads`: the step's
        intra-op threads while the source is open, restored after. `calls`: the transform
        calls `raw` replays, one list per cached sample (the recorded ones by default;
        confirm.py replays part of a Compose from a cached intermediate). `keep`: left open
        after the visit for the next one (close_kept), kept as the point's (True) or under
        this key (a trial's side: its settings, verify._visit). `variant`: `full` as a fix
        of the pipeline runs it (core.fixes.Variant: its dataset copy, and its work on each
        batch after the transfer; in a user's loop the batches are then handed over on the
        device)."""
        before = torch.get_num_threads()
        if threads:
            torch.set_num_threads(int(threads))
        try:
            if keep:
                yield from self._kept(name if keep is True else keep, name, spec, epochs, variant=variant)
            else:
                source, move = self._source(name, spec or self.spec, epochs, calls, variant=variant)
                with source as next_batch:
                    yield next_batch, move
        finally:
            if threads:
                torch.set_num_threads(before)

    def keeps(self, name: str) -> bool:
        """Whether point `name`'s replay loader stays open from one visit to the next
        (`open`, keep): its workers started once. Each visit of a loader started anew
        pays for the start in its first steps, beyond the untimed first batch: a worker
        pool forked from this process shares its memory copy-on-write, so the step after
        the fork copies every page it writes (docs/benchmarks.md, issue 30), time a long
        step's visit has no warm-up for, and a few seconds of every round with steps of
        a second. A loader parked between visits (`parks`) does no work meanwhile; one
        that cannot be parked is kept open only where your workers are persistent (it
        finishes the batches in flight, a batch or two per worker, while the next point
        starts, as at the end of a visit of your loop's own pool). A pool is kept only
        while the machine has the memory for it (room_for_a_pool)."""
        if name in self.kept:
            return True
        if not self.worker_point(name):
            return False
        return (self.parks(name) or bool(getattr(self.spec, "persistent_workers", False))) and room_for_a_pool()

    def keeps_side(self, spec: LoaderSpec) -> bool:
        """Whether the full pipeline with `spec`'s settings, its epochs ending as the
        user's loop ends them (a side of a trial: verify._visit), is kept from one visit
        to the next, parked between them (`parks`): where its workers are persistent, so
        that they start once, as they do in the user's loop with those settings, and a
        pool that takes seconds to start pays them in its first visit's first batch
        (untimed) and in none of its windows. A pool is kept only while the machine has
        the memory for it (room_for_a_pool)."""
        return self.parks("full", spec, epochs=True) and room_for_a_pool()

    def worker_point(self, name: str, spec: Optional[LoaderSpec] = None) -> bool:
        """Whether point `name`'s batches come from a loader's workers (`spec`'s, or the
        user's): not the batches cached on the host or device, nor a loader without workers."""
        return name not in ("host", "device") and (spec or self.spec).num_workers > 0

    def parks(self, name: str, spec: Optional[LoaderSpec] = None, epochs: bool = False) -> bool:
        """Whether point `name`'s replay loader can be parked between visits (sources.
        LoaderSource.park): a DataLoader over a map-style dataset (the cached points,
        and `full` but for an IterableDataset), not behind a loader wrapper, with
        workers. Its workers are then persistent, a setting that differs from yours only
        at an epoch's end, which no window holds (the advice's check measures that end
        with your setting). `spec`: other settings of `full`; `epochs`: its epochs end as
        in the user's loop, where only persistent workers can be parked (sources.
        full_loader)."""
        spec = spec or self.spec
        return (self.worker_point(name, spec) and self.wrapper is None
                and self.loop_stages is None and spec.loader_cls is DataLoader and not (name == "full" and spec.iterable)
                and not (name in ("raw", "augmented") and self.caches is not None and self.caches.stages is not None)
                and (not epochs or bool(spec.persistent_workers)))

    def resumes(self, name: str) -> bool:
        """Whether the next visit of point `name` (or of the kept source of that key)
        resumes its parked replay loader: its queue was emptied at the park and its
        workers idle since, so at the resume they start together on an empty queue, as
        in their steady state after a batch each: no batch is ready ahead of the step but
        where the step is the slower side, which is that steady state too. Its warm-up is
        then the plan's alone, without the prefetch that a start (the first steps slow
        after the fork, the workers filling the queue meanwhile) or a pause (the queue
        filled) holds: measured with scripts/bench_resume_steps.py (docs/benchmarks.md,
        issue 30). (A pool kept open without parking made its batches in flight meanwhile.)"""
        source = self.kept[name][3] if name in self.kept else None
        return isinstance(source, sources.LoaderSource) and source.parked

    def start_prefetch(self, name: str, prefetch: int, kept: bool, lockstep: bool = False) -> int:
        """The batches a visit of `name` may find ready at its start (its warm-up steps
        through them): `prefetch`, or none where it resumes a parked pool (`kept`: it uses
        the kept source; resumes). Under torchrun every rank warms up alike, whether its
        own pool was kept (room_for_a_pool) or not: the whole prefetch."""
        return 0 if kept and not lockstep and self.resumes(name) else prefetch

    def _kept(self, key: str, name: str, spec: Optional[LoaderSpec] = None, epochs: bool = False, *,
              variant: Optional[Variant] = None) -> Iterator[tuple]:
        """The point's source as `open` gives it (`spec`, `epochs`: see `open`), kept as
        `key`, opened at its first visit and kept after it: parked (its epoch ended after
        the batches in flight, its workers idle) and resumed at the next visit, whose
        first batch and warm-up then go as at a first visit without the workers' start;
        or, where it cannot be parked, left open. A visit that fails closes it (its
        workers terminated, as `open` does)."""
        if key not in self.kept:
            stack = contextlib.ExitStack()
            source, move = self._source(name, spec or self.spec, epochs, park=self.parks(name, spec, epochs),
                                        variant=variant)
            self.kept[key] = (stack, stack.enter_context(source), move, source)
        stack, next_batch, move, source = self.kept[key]
        gated = isinstance(source, sources.LoaderSource) and source.gate is not None
        if gated:
            source.resume()  # (nothing to resume at the first visit)
        try:
            yield next_batch, move
            parked = not gated or source.park()  # (not parkable: left open, its workers persistent)
        except BaseException as exc:
            del self.kept[key]
            stack.__exit__(type(exc), exc, exc.__traceback__)
            raise
        if not parked:  # its epoch did not end: not left running beside the next point
            del self.kept[key]
            stack.close()

    def close_kept(self, keep: Iterable = (), only: Optional[Iterable] = None) -> None:
        """Close the sources kept open between visits (their workers shut down), but those
        of the points (or keys) in `keep`; `only`: those of these keys alone."""
        for name in [n for n in self.kept if n not in keep and (only is None or n in only)]:
            stack = self.kept.pop(name)[0]
            stack.close()

    def _source(self, name: str, spec: LoaderSpec, epochs: bool, calls: Optional[list] = None,
                park: bool = False, *, variant: Optional[Variant] = None) -> tuple:
        """The point's batch source and transfer; with a WebLoader's stages under --entry,
        every point's batches go through them, the device point's too, as in the user's
        loop (under `run` the loop runs them itself). A fix's `variant` works on each batch
        after its transfer (in a user's loop, which moves its batches itself, on batches
        handed over on the device: the loop's own move then leaves them there)."""
        source, move = self._point_source(name, spec, epochs, calls, park, variant=variant)
        if self.loop_stages is not None and not self.loop:
            source = self.loop_stages.through(source)
        if variant is not None and variant.after is not None:
            move = variant.through(self.move if self.loop else move)
        return source, move

    def _point_source(self, name: str, spec: LoaderSpec, epochs: bool, calls: Optional[list] = None,
                      park: bool = False, *, variant: Optional[Variant] = None) -> tuple:
        caches = self.caches
        if name == "device":
            host = sources.host_batches(caches, spec, self.device)
            return sources.cached_source(sources.device_batches(host, self.move, self.device), self.fresh), None
        if isinstance(spec, nodes.NodeSpec) and name != "host":  # a node graph's own sources
            source = graph.source(spec, name, caches, epochs=epochs, calls=calls,
                                  fresh=self.fresh and self.device.type == "cpu")
        elif name == "full":
            dataset = variant.dataset if variant is not None else caches.dataset if caches else _tagged_copy(spec)
            if variant is not None and variant.collate is not None:
                spec = dataclasses.replace(spec, collate_fn=variant.collate)
            source = sources.full_loader(spec, dataset, epochs, park)
        elif name in ("raw", "augmented") and caches.stages is not None:  # a pipeline cut into its stages
            source = sources.stream_loader(spec, caches.stages.replay(name))
        elif name == "raw":
            source = sources.sample_loader(spec, sources.RawReplay(caches.samples, calls or caches.raw_calls),
                                           caches.groups, park)
        elif name == "augmented":
            source = sources.sample_loader(spec, sources.SampleCache(caches.samples), caches.groups, park)
        elif name == "collated":
            source = sources.batch_loader(spec, caches.batches, self.fresh and self.device.type == "cpu", park)
        else:  # host
            source = sources.cached_source(sources.host_batches(caches, spec, self.device))
        if self.loop:  # the user's loop moves its batches itself
            return source, None
        if self.wrapper is not None:  # the user's wrapper moves the batches, overlapping the step
            return timm.through(self.wrapper, source), None
        if self.fresh and self.device.type != "cpu":
            # A step that changes its batch gets a copy made on the device after the
            # transfer, as the device point makes one: the host batch stays pinned, and
            # both sides of `transfer` pay the same copy.
            return source, self._move_then_copy
        return source, self.move

    def _move_then_copy(self, batch: Any) -> Any:
        return tree.clone(self.move(batch))


def room_for_a_pool() -> bool:
    """Whether the machine has the memory for one more worker pool kept open: more
    available than twice this process's resident size. A pool forked from this process
    shares its pages copy-on-write and comes to hold the old copy of every page the step
    writes afterwards (docs/benchmarks.md, issue 30). True where /proc cannot tell."""
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
        with open("/proc/self/statm") as f:
            resident = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, StopIteration, ValueError, IndexError):
        return True
    return available > 2 * resident


def _tagged_copy(spec: LoaderSpec) -> Any:
    """A copy of the dataset whose transforms name the augment stage when they raise
    (not recording): for the full point when the caches could not be filled."""
    if spec.iterable:
        return None
    try:
        return split.instrument(spec.dataset).dataset
    except Exception:  # cannot be copied: the full point runs over a plain copy
        return None
