"""The driver's side of a run across lab hosts: connect to the Ray cluster, check that its head runs this
devicelab and llama.cpp, place each device's lane on the node that advertises the device, relay the lanes'
events to the display, and turn a lab host that went away into its devices' cells failed-retryable — one line
naming the host — while the other hosts' lanes finish."""

from __future__ import annotations

import json
import logging
import os
import time

from ..errors import DevicelabError
from ..lab import this_host
from ..ledger import DONE, SKIPPED
from ..runner.lane import EVENT_CALLS
from ..runner.placement import RunSetup
from . import KV_NAMESPACE, lease_key, resource, tls
from .node import code_digest, head_identity, mismatch, use_auth_token

WAIT_NOTE_S = float(os.environ.get("DEVICELAB_CLUSTER_WAIT_NOTE_S", "5"))  # not placed by then: say who holds it


class _LaneState:
    def __init__(self, device, cells, where):
        self.device, self.cells, self.where = device, cells, where  # where: (node id, lab host) or None
        self.holder = None  # its LaneActor (which holds the device's resource and drives it)
        self.ready = None  # its ready() ref, until it answered
        self.run = None  # its run ref
        self.asked = time.time()
        self.noted = False
        self.done = False


class ClusterPlacement:
    """Each lane on the lab host its device is plugged into (runner/placement.py's Placement)."""

    sweeps_sources = False  # the head and every lab host hold one llama.cpp source

    def __init__(self, address: str, tls_dir=None):
        self.address, self.tls_dir = address, tls_dir
        self.su: RunSetup | None = None

    @property
    def setup(self) -> RunSetup:
        """What the run gave open()."""
        assert self.su is not None, "open() comes first"
        return self.su

    def open(self, setup: RunSetup) -> None:
        """Connect to the cluster and check that its head runs this devicelab and llama.cpp."""
        address = self.address
        tls.use(self.tls_dir, this_host(), client=True)  # Ray's TLS, where the lab has it (--tls or DEVICELAB_TLS)
        head = head_identity(address)  # says so in one line when Ray is not installed
        import ray

        self.su, self.ray = setup, ray
        from ..build.source import tree_digest

        src = setup.host.src
        mine = {"code": code_digest(), "llama_cpp": src.commit, "llama_tree": tree_digest(src.path)}
        why = mismatch(mine, head, who="this run's")
        if why:
            raise DevicelabError(f"cannot run on the cluster at {address}: {why}")
        use_auth_token()
        try:
            ray.init(address=address, namespace="devicelab", logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise DevicelabError(
                f"cannot join the Ray cluster at {address} from here ({str(e).splitlines()[0]}): run "
                "`devicelab run --cluster` on the head host"
            ) from None
        self.me = ray.get_runtime_context().get_node_id()
        self.where: dict[str, tuple[str, str]] = {}
        for n in ray.nodes():
            if not n.get("Alive"):
                continue
            host = (n.get("Labels") or {}).get("devicelab.host") or n.get("NodeManagerAddress")
            for r in n.get("Resources", {}):
                if r.startswith("device:"):
                    self.where[r[len("device:") :]] = (n["NodeID"], host)

    def _lease_holder(self, device: str) -> str | None:
        from ray.experimental import internal_kv

        raw = internal_kv._internal_kv_get(lease_key(device), namespace=KV_NAMESPACE)
        if not raw:
            return None
        h = json.loads(raw)
        return (
            f"run {h.get('run')} of recipe {h.get('recipe')} from {h.get('head')}, since "
            f"{time.strftime('%H:%M:%S', time.localtime(h.get('since', 0)))}"
        )

    def run(self, lanes, run_id: str, rep, prepare: bool = False) -> None:
        if prepare:  # its lanes run once (no sweep, no rounds): each makes its builds as it opens
            return
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from .head import Head

        ray, su = self.ray, self.setup
        here = NodeAffinitySchedulingStrategy(self.me, soft=False)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})
        self.head = Head.options(scheduling_strategy=here).remote(  # type: ignore[attr-defined]  # an actor class: ray's typed remote() rejects its max_concurrency, so its ActorClass type is lost
            str(su.ledger_path), su.host_kwargs, self.queue, su.telemetry, run_id
        )
        info = ray.get(self.head.info.remote())
        lease = {"run": run_id, "recipe": su.recipe_name, "head": this_host(), "since": time.time()}
        states = [_LaneState(d, cells, self.where.get(d.name)) for d, cells in lanes]
        self.outcome: dict[str, bool] = {}  # cell id -> ok, from the lanes' own events
        for st in states:
            self._place(st, run_id, info, lease)
        try:
            while any(not st.done for st in states):
                refs = [r for st in states if not st.done for r in (st.ready, st.run) if r is not None]
                ray.wait(refs, num_returns=1, timeout=0.2)
                self._drain()
                for st in states:
                    if not st.done:
                        self._step(st)
        except KeyboardInterrupt:
            self._interrupt(states)
            raise
        finally:
            self._drain()
            rep.ran += sum(1 for ok in self.outcome.values() if ok)
            rep.failed += [c for c, ok in self.outcome.items() if not ok]
            for st in states:
                self._release(st)
            ray.kill(self.head)
            ray.shutdown()

    def _place(self, st: _LaneState, run_id: str, info: dict, lease: dict) -> None:
        """Ask for the device's resource: a lane actor on its lab host (the head's own included), which drives the
        device once Ray grants it the resource."""
        from .head import LaneActor

        name, su = st.device.name, self.setup
        if st.where is None:
            h = st.device.lab_host
            self._fail_rest(
                st,
                f"{name}: no lab host in the cluster at {self.address} advertises it; run `devicelab "
                + (f"worker --address {self.address} --host {h}` on {h}" if h else "head` with this lab file")
                + " (the lab file's lab_host says where it is plugged in)",
            )
            return
        st.holder = LaneActor.options(resources={resource(name): 1}).remote(self.head, self.queue)  # type: ignore[attr-defined]  # as Head's above
        st.run = st.holder.run.remote(st.device.model_dump(), st.cells, run_id, su.telemetry, info, lease)
        st.ready = st.holder.ready.remote()
        su.events.lane(name, f"placing on lab host {st.where[1]}")

    def _drain(self) -> None:
        """The lanes' events, in order, to the display: only the calls the Events protocol names."""
        while True:
            try:
                items = self.queue.get_nowait_batch(max(1, self.queue.size()))
            except Exception:  # empty
                return
            if not items:
                return
            for name, args in items:
                if name not in EVENT_CALLS:
                    continue
                if name == "cell_done":
                    self.outcome[args[0].cell_id] = bool(args[1])
                getattr(self.setup.events, name)(*args)

    def _fail_rest(self, st: _LaneState, why: str) -> None:
        su = self.setup
        for c in st.cells:
            if c.cell_id in self.outcome or su.ledger.status(c.cell_id) in (DONE, SKIPPED):
                continue
            su.ledger.fail_cell(c.cell_id, why, retryable=True)
            self.outcome[c.cell_id] = False
            su.events.cell_done(c, False, why)
        st.done = True
        su.events.lane(st.device.name, "lab host gone" if st.where else "not placed")

    def _interrupt(self, states: list[_LaneState]) -> None:
        """Ctrl-C: every lane stops its payload and puts its device back (up to 120 s)."""
        for st in states:
            if st.run is not None and st.holder is not None:
                st.holder.interrupt.remote()
        deadline = time.time() + 120
        for st in states:
            if st.run is not None:
                self.ray.wait([st.run], timeout=max(0.0, deadline - time.time()))
        self._drain()

    def _step(self, st: _LaneState) -> None:
        if st.ready is not None:
            self._step_ready(st)
            if st.done:
                return
        if st.run is not None and st.ready is None:
            self._step_run(st)

    def _step_ready(self, st: _LaneState) -> None:
        """Its device's resource granted (the lane starts), or still held by another run (say by whom)."""
        name, host, ev = st.device.name, st.where[1], self.setup.events
        got, _ = self.ray.wait([st.ready], timeout=0)
        if got:
            st.ready = None
            try:
                there = self.ray.get(got[0])
            except Exception as e:  # the host went away before the lane started
                self._fail_rest(
                    st,
                    f"{name}: lab host {host} went away before its lane started "
                    f"({type(e).__name__}); run again once it is back",
                )
                self._release(st)
                return
            theirs = (there or {}).get("code")
            if theirs is not None and theirs != code_digest():  # checked by every lane, at the start of every run
                self._fail_rest(
                    st,
                    f"{name}: lab host {host} runs another devicelab (code {theirs}, this run's {code_digest()}): "
                    "install the same devicelab commit there and restart its worker",
                )
                self._release(st)
                return
            ev.lane(name, f"on lab host {host}")
        elif not st.noted and time.time() - st.asked > WAIT_NOTE_S:
            holder = self._lease_holder(name)
            if holder is None:  # still starting its lane there: look again later
                st.asked = time.time()
            else:
                st.noted = True
                msg = f"{name} is held by {holder}: waiting for it"
                ev.lane(name, "waiting: " + msg)
                ev.stage(msg)

    def _step_run(self, st: _LaneState) -> None:
        got, _ = self.ray.wait([st.run], timeout=0)
        if not got:
            return
        try:
            self.ray.get(got[0])
            st.done = True
        except Exception as e:  # its node died, or the actor did
            self._fail_rest(
                st,
                f"{st.device.name}: lab host {st.where[1]} went away during the run "
                f"({type(e).__name__}); run again once it is back",
            )
        self._release(st)

    def _release(self, st: _LaneState) -> None:
        """The device is free for another run as soon as its lane ends (its process ends with it)."""
        if st.holder is None:
            return
        self.ray.kill(st.holder)
        st.holder = None
        if st.where and st.where[0] == self.me:
            self.head.cpu_drop.remote(st.device.name)  # what it held of the head's CPUs, also when killed mid-measure
