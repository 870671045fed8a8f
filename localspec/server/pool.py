"""The loaded models: one Engine per model, loaded on demand, unloaded when idle or out of room.

One engine per model, each with its own worker thread, rather than one engine that
schedules between models: an engine owns its llama.cpp contexts, KV cache, n-gram
memory and calibration, and runs requests one at a time; keeping that unchanged
makes a second model cost exactly its memory, and requests to different models run
side by side, sharing only the CPU cores or GPU they both use (on a 2-core machine
two concurrent decodes each run at about half speed: that is the hardware's limit).

Loads are serialised (one `_load_lock`): two models loading at once would each take
the whole machine's bandwidth and could both pass the memory check before either
was counted. Each load plans with the memory free when it starts (server.budget.Room):
a model that does not fit beside the others unloads the least recently used idle ones
first, and then, where the rest's saved conversation caches (engine.promptcache) are what
it does not fit beside, drops those; one that cannot fit even alone is refused with the numbers.
After its last request a model stays loaded for its keep_alive (Ollama's: 0 unloads
at once, None stays until the daemon stops), then unloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from localspec.engine.config import EngineConfig
from localspec.engine.worker import Engine
from localspec.errors import LocalspecError, ModelLoadError, OverloadedError
from localspec.pickdraft.devices import DeviceMemory
from localspec.server.budget import Budget, Footprint, Room, size
from localspec.server.catalog import ServedModel

log = logging.getLogger("localspec.pool")

# Keep the model's own default: no keep_alive in the request.
DEFAULT = object()


@dataclass(frozen=True)
class Loadout:
    """How one model is loaded: its engine config, why that draft, and what it takes."""

    config: EngineConfig
    pick: str | None
    footprint: Footprint


@dataclass
class Resident:
    """One loaded (or loading) model."""

    model: ServedModel
    engine: Engine
    loadout: Loadout
    keep_alive: float | None  # seconds after its last request; None: until the daemon stops
    busy: int = 0
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.time)
    load_s: float | None = None
    expires_at: float | None = None  # wall-clock time; None while busy or kept forever
    unload_when_idle: bool = False  # keep_alive 0 asked while it was busy
    timer: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def loading(self) -> bool:
        return self.engine.info.status == "loading"

    @property
    def footprint(self) -> Footprint:
        """What it takes now: the plan's count, and what its plain prefill copy grew by since."""
        return self.loadout.footprint + Footprint(host=self.engine.info.prefill_grown_bytes)


# Its engine config and footprint, planned on the machine as this load sees it (Room.alone).
Prepare = Callable[[ServedModel, DeviceMemory], Loadout]
MakeEngine = Callable[[EngineConfig], Engine]


class ModelPool:
    """Owns the engines of the loaded models. Its methods run on the event loop."""

    def __init__(
        self,
        prepare: Prepare,
        make_engine: MakeEngine,
        room: Room,
        keep_alive: Callable[[ServedModel], float | None],
    ) -> None:
        self._prepare = prepare
        self._make_engine = make_engine
        self.room = room
        self._default_keep_alive = keep_alive
        self.resident: dict[str, Resident] = {}
        self._loadouts: dict[str, Loadout] = {}
        self._plan_lock = threading.Lock()  # one pick-draft per model, whichever thread asks first
        self._load_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.loading: str | None = None

    def adopt(self, model: ServedModel, loadout: Loadout, engine: Engine) -> Resident:
        """Count an engine started elsewhere (the daemon's default model, loading at start)."""
        res = Resident(model, engine, loadout, self._default_keep_alive(model))
        engine.limit_growth(self._may_grow)
        self._loadouts[model.name] = loadout
        self.resident[model.name] = res
        return res

    def used(self, but: Resident | None = None) -> Footprint:
        total = Footprint()
        for res in list(self.resident.values()):  # a snapshot: plan() reads it from a thread
            if res is not but:
                total = total + res.footprint
        return total

    def _may_grow(self, extra: int) -> bool:
        """Whether a loaded model's plain prefill copy may take `extra` bytes more (asked from its
        engine's thread): within max_resident beside every loaded model, as it grew since counted."""
        cap = self.room.cap
        return cap is None or self.used().total + extra <= cap

    def saved(self) -> Footprint:
        """The loaded models' saved conversation caches: host memory a load may have them drop."""
        return Footprint(host=sum(res.engine.info.saved_prompt_bytes for res in list(self.resident.values())))

    async def acquire(self, model: ServedModel) -> Resident:
        """The model's engine, loaded and ready, counted busy until `release`. Waits for a load."""
        while True:
            res = self.resident.get(model.name)
            if res is not None and res.load_s is not None and res.engine.info.status == "failed":
                # It was serving and its engine died (an RPC worker went down): load it anew.
                self.resident.pop(model.name, None)
                self._spawn(_close(res.engine))
                continue
            if res is None:
                async with self._load_lock:
                    if model.name not in self.resident:
                        await self._load(model)
                continue
            res.busy += 1
            res.unload_when_idle = False  # the latest request decides, as in Ollama
            self._cancel_timer(res)
            try:
                await self._ready(res)
            except BaseException:
                res.busy -= 1
                raise
            return res

    def release(self, res: Resident, keep_alive: object = DEFAULT) -> None:
        """One request ended; the model's keep_alive starts when none is left."""
        res.busy = max(0, res.busy - 1)
        res.last_used = time.monotonic()
        if keep_alive is not DEFAULT:
            assert keep_alive is None or isinstance(keep_alive, float)
            res.keep_alive = keep_alive
        else:
            res.keep_alive = self._default_keep_alive(res.model)
        if res.busy == 0 and self.resident.get(res.name) is res:
            self._schedule(res)

    async def unload(self, name: str) -> bool:
        """Unload an idle model now (keep_alive 0 without a request); False when it is not loaded."""
        res = self.resident.get(name)
        if res is None:
            return False
        res.unload_when_idle = True  # it goes once loaded and idle; a later request cancels this
        if res.loading:
            # Wait for the load: nothing else would act on the flag for a model loading at start
            # (no request holds it, so no release schedules its unload), and it stayed forever.
            with contextlib.suppress(LocalspecError):  # a failed load is gone (or ends the daemon)
                await asyncio.to_thread(res.engine.wait_ready)
        if self.resident.get(name) is res and res.unload_when_idle and not res.busy:
            await self._unload(res, "asked to")
        return True

    def forget(self, name: str) -> None:
        """Plan `name` afresh at its next load (its file was deleted, or replaced)."""
        self._loadouts.pop(name, None)

    def close(self) -> None:
        """Close every engine (blocking: the daemon calls it once its event loop has stopped)."""
        for res in list(self.resident.values()):
            if res.timer is not None:
                res.timer.cancel()
            self.resident.pop(res.name, None)
            res.engine.close()

    def rpc_endpoints(self) -> list[str]:
        """The RPC workers of every model loaded so far (loaded now or not), for /health."""
        seen = (e for loadout in self._loadouts.values() for e in loadout.config.load.rpc)
        return list(dict.fromkeys(seen))

    def engines(self) -> list[Engine]:
        return [res.engine for res in self.resident.values()]

    # --- loading --------------------------------------------------------------------

    async def _ready(self, res: Resident) -> None:
        if not res.loading and res.engine.info.status == "ready":
            return
        try:
            await asyncio.to_thread(res.engine.wait_ready)
        except LocalspecError as exc:
            if self.resident.get(res.name) is res:
                self.resident.pop(res.name)
                self._spawn(_close(res.engine))
            raise ModelLoadError(f"{res.name} failed to load: {exc.message}") from None

    async def _load(self, model: ServedModel) -> None:
        """Load `model` (the caller holds the load lock); failures are this request's error."""
        for other in list(self.resident.values()):  # the default model may still be loading
            if other.loading:
                with contextlib.suppress(LocalspecError):  # its own waiters see its error
                    await asyncio.to_thread(other.engine.wait_ready)
        self.loading = model.name
        try:
            # The memory free now, and what the loaded models and their saved caches hold.
            device = await asyncio.to_thread(self.room.alone, self.used() + self.saved())
            loadout = await self._loadout(model, device)
            await self._make_room(model.name, loadout.footprint, self.room.budget(device))
            started = time.monotonic()
            engine = self._make_engine(loadout.config)
            res = Resident(model, engine, loadout, self._default_keep_alive(model))
            engine.limit_growth(self._may_grow)
            self.resident[model.name] = res
            log.info("loading %s (%s)", model.name, loadout.pick or "as configured")
            res.busy += 1  # a failed load must not count as idle and be evicted meanwhile
            try:
                await self._ready(res)
            finally:
                res.busy -= 1
            res.load_s = time.monotonic() - started
            res.loaded_at = time.time()
            log.info("loaded %s in %.2fs: %s", model.name, res.load_s, loadout.footprint.describe())
            self._schedule(res)  # a load with no request (nobody waiting) still expires
        finally:
            self.loading = None

    def plan(self, model: ServedModel) -> Loadout:
        """How `model` loads (or loaded): what a listing reports before a load, and the load then uses.

        Blocking (pick-draft reads headers, the machine is probed): call it off the event loop.
        """
        return self._planned(model, lambda: self.room.alone(self.used() + self.saved()))

    async def _loadout(self, model: ServedModel, device: DeviceMemory) -> Loadout:
        return await asyncio.to_thread(self._planned, model, lambda: device)

    def _planned(self, model: ServedModel, device: Callable[[], DeviceMemory]) -> Loadout:
        """Its engine config and footprint: pick-draft for this target, once per daemon and model,
        against the memory a load may use once it makes room (`device`)."""
        with self._plan_lock:
            cached = self._loadouts.get(model.name)
            if cached is None:
                try:
                    cached = self._prepare(model, device())
                except LocalspecError as exc:
                    raise type(exc)(f"{model.name}: {exc.message}", param=exc.param) from None
                self._loadouts[model.name] = cached
            return cached

    async def _make_room(self, name: str, need: Footprint, budget: Budget) -> None:
        """Unload the least recently used idle models until `need` fits beside the rest without
        saved caches, then drop the rest's saved caches until it fits with them; refuse when it
        cannot fit."""
        if not budget.fits(Footprint(), need):
            raise budget.refuse(name, need)
        dropped: set[str] = set()
        while not budget.fits(self.used(), need, self.saved()):
            keeping = [r for r in self.resident.values() if r.name not in dropped]
            keeping = [r for r in keeping if r.engine.info.saved_prompt_bytes]
            keeping.sort(key=lambda r: (r.busy > 0, r.last_used))  # idle models' first, then the oldest
            if keeping and budget.fits(self.used(), need):
                # A cache read again costs one prompt's reading; an unloaded model its load and all
                # its caches. Busy models' too: the engine waits for a cache switch under way.
                res = keeping[0]
                dropped.add(res.name)
                freed = await asyncio.to_thread(res.engine.drop_saved_prompts)
                log.info("dropped %s of %s's saved caches to make room for %s", size(freed), res.name, name)
                continue
            idle = sorted((r for r in self.resident.values() if not r.busy), key=lambda r: r.last_used)
            if not idle:
                busy = ", ".join(self.resident)
                raise OverloadedError(
                    f"{name} needs {size(need.total)} and the busy models ({busy}) leave too little of "
                    f"{budget.describe()}; retry when their requests end"
                )
            await self._unload(idle[0], f"to make room for {name}")

    # --- unloading ------------------------------------------------------------------

    def _schedule(self, res: Resident) -> None:
        """Start the idle model's keep_alive: unload now (0), never (None), or on a timer."""
        self._cancel_timer(res)
        if res.unload_when_idle:
            self._spawn(self._expire(res))
            return
        if res.keep_alive is None:
            return
        if res.keep_alive <= 0:
            self._spawn(self._expire(res))
            return
        res.expires_at = time.time() + res.keep_alive
        loop = asyncio.get_running_loop()
        res.timer = loop.call_later(res.keep_alive, lambda: self._spawn(self._expire(res)))

    def _cancel_timer(self, res: Resident) -> None:
        if res.timer is not None:
            res.timer.cancel()
        res.timer = None
        res.expires_at = None

    async def _expire(self, res: Resident) -> None:
        if res.busy or self.resident.get(res.name) is not res:
            return  # a request came in meanwhile; its release schedules again
        await self._unload(res, "its keep_alive ran out")

    async def _unload(self, res: Resident, why: str) -> None:
        # Out of the table first: a request arriving meanwhile loads it again rather than using it.
        self._cancel_timer(res)
        self.resident.pop(res.name, None)
        log.info("unloading %s (%s)", res.name, why)
        await asyncio.to_thread(res.engine.close)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


async def _close(engine: Engine) -> None:
    await asyncio.to_thread(engine.close)
