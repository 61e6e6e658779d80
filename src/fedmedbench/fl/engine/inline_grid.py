"""A Flower ``Grid`` that delivers each Message to the ClientApp in this process.

Why: ``run_simulation`` starts and stops Ray for every job (~9 s) and polls its
queues (~0.2 s per round), which dominates small jobs. The ServerApp and ClientApp
are unchanged; only delivery differs. Like Flower's simulation engine, every node
has its own :class:`~flwr.app.Context` (``partition-id`` in ``node_config``, a
``state`` kept across rounds), node ids are opaque integers, every message gets an
id, and a ClientApp exception becomes an error reply (never a missing one). Clients
run one after another; with ``wire=True`` every message is also serialised to
Flower's protobuf and back, as it would be over the network (used by tests).
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Iterable
from uuid import uuid4

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity


class InlineGrid(Grid):
    def __init__(self, client_app: ClientApp, num_nodes: int, seed: int = 0, wire: bool = False) -> None:
        rng = random.Random(seed)
        ids: list[int] = []
        while len(ids) < num_nodes:  # opaque ids like Flower's: never the partition id
            node = rng.getrandbits(62) + 2
            if node != SUPERLINK_NODE_ID and node not in ids:
                ids.append(node)
        self.client_app = client_app
        self.wire = wire
        self._run = Run.create_empty(run_id=rng.getrandbits(62) + 1)
        self.contexts = {
            node: Context(run_id=self._run.run_id, node_id=node, node_config={"partition-id": pid, "num-partitions": num_nodes},
                          state=RecordDict(), run_config={})
            for pid, node in enumerate(ids)
        }
        # the identity Flower's runtimes give a ServerApp process (messages are stamped with it)
        TaskIdentity.task_id = 1
        TaskIdentity.run_id = self._run.run_id
        TaskIdentity.node_id = SUPERLINK_NODE_ID
        self._pending: dict[str, Message] = {}
        self._replies: dict[str, Message] = {}

    # -- Grid API -------------------------------------------------------------------
    def set_run(self, run: Run) -> None:
        self._run = run

    @property
    def run(self) -> Run:
        return self._run

    def serve(self, server_app: ServerApp) -> None:
        """Run the ServerApp on this grid."""
        server_app(self, Context(run_id=self._run.run_id, node_id=SUPERLINK_NODE_ID, node_config={},
                                 state=RecordDict(), run_config={}))

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        return Message(content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        ids = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self.contexts:
                raise ValueError(f"message to unknown node {msg.metadata.dst_node_id}")
            if msg.metadata.reply_to_message_id or msg.metadata.ttl <= 0:
                raise ValueError(f"invalid instruction message: {msg.metadata}")
            msg.metadata.__dict__["_message_id"] = str(uuid4())
            self._pending[msg.metadata.message_id] = self._transmit(msg)
            ids.append(msg.metadata.message_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        out = []
        for mid in message_ids:
            if mid in self._pending:
                self._replies[mid] = self._deliver(self._pending.pop(mid))
            if mid in self._replies:
                out.append(self._replies.pop(mid))
        return out

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))

    # -- delivery -------------------------------------------------------------------
    def _transmit(self, msg: Message) -> Message:
        return message_from_proto(message_to_proto(msg)) if self.wire else msg

    def _deliver(self, msg: Message) -> Message:
        """Run the ClientApp on one message; an exception becomes an error reply, as in Flower."""
        context = self.contexts[msg.metadata.dst_node_id]
        try:
            reply = self.client_app(msg, context)
        except Exception as exc:  # noqa: BLE001 - reported to the server as Flower does
            reason = f"{type(exc)}:<'{exc}'>\n{traceback.format_exc()}"
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason), reply_to=msg)
        if reply.metadata.reply_to_message_id != msg.metadata.message_id:
            raise RuntimeError("the ClientApp's reply does not answer the message it got (build it with reply_to=msg)")
        reply.metadata.__dict__["_message_id"] = str(uuid4())
        return self._transmit(reply)
