"""The official A2A Python SDK (a2a-sdk 0.3) as a client of `hame serve --a2a`.

Usage: client.py BASE_URL TOKEN OTHER_TOKEN
Prints one JSON object with what each step saw (the Rust test asserts on it).
"""

import asyncio
import json
import sys
import time
import uuid

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientJSONRPCError
from a2a.types import Message, Part, Role, TaskIdParams, TaskQueryParams, TextPart


def message(text, context_id=None):
    return Message(
        role=Role.user,
        parts=[Part(root=TextPart(text=text))],
        message_id=str(uuid.uuid4()),
        context_id=context_id,
    )


def text_of(parts):
    return "".join(p.root.text for p in parts if getattr(p.root, "kind", "") == "text")


def task_view(task):
    return {
        "id": task.id,
        "context_id": task.context_id,
        "state": task.status.state.value,
        "artifacts": [text_of(a.parts) for a in (task.artifacts or [])],
        "history": [m.role.value for m in (task.history or [])],
    }


def rpc_error(e):
    return {"code": e.error.code, "message": e.error.message}


async def main():
    base, token, other = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        card = await A2ACardResolver(http, base).get_agent_card()
        out["card"] = {
            "name": card.name,
            "url": card.url,
            "streaming": card.capabilities.streaming,
            "skills": [s.id for s in card.skills],
            "protocol": card.protocol_version,
        }
        # message/send (blocking), then a second message in the same context.
        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        events = [e async for e in client.send_message(message("first question"))]
        task, _ = events[0]
        out["send"] = task_view(task)
        events = [
            e async for e in client.send_message(message("second question", task.context_id))
        ]
        out["send_again"] = task_view(events[0][0])
        # tasks/get
        got = await client.get_task(TaskQueryParams(id=task.id))
        out["get"] = task_view(got)
        # message/stream
        streaming = ClientFactory(ClientConfig(streaming=True, httpx_client=http)).create(card)
        kinds = []
        last = None
        async for t, update in streaming.send_message(message("stream please")):
            if update is None:
                kinds.append("task:" + t.status.state.value)
            elif update.kind == "status-update":
                kinds.append("status:" + update.status.state.value + (":final" if update.final else ""))
            else:
                kinds.append("artifact:" + text_of(update.artifact.parts))
            last = t
        out["stream"] = {"events": kinds, "task": task_view(last)}
        # tasks/cancel of a task whose tool sleeps.
        polling = ClientFactory(
            ClientConfig(streaming=False, polling=True, httpx_client=http)
        ).create(card)
        events = [e async for e in polling.send_message(message("sleep please"))]
        sleeping = events[0][0]
        state = sleeping.status.state.value
        deadline = time.monotonic() + 30
        while state != "working" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            state = (await client.get_task(TaskQueryParams(id=sleeping.id))).status.state.value
        # Let the tool start.
        await asyncio.sleep(1.5)
        asked = time.monotonic()
        cancelled = await client.cancel_task(TaskIdParams(id=sleeping.id))
        out["cancel"] = {
            "before": state,
            "after": cancelled.status.state.value,
            "seconds": round(time.monotonic() - asked, 2),
            "id": sleeping.id,
        }
        try:
            await client.cancel_task(TaskIdParams(id=task.id))
            out["cancel_finished"] = "accepted"
        except A2AClientJSONRPCError as e:
            out["cancel_finished"] = rpc_error(e)
        try:
            await client.get_task(TaskQueryParams(id="../../etc/passwd"))
            out["get_hostile"] = "accepted"
        except A2AClientJSONRPCError as e:
            out["get_hostile"] = rpc_error(e)
    # Another tenant does not see the task.
    async with httpx.AsyncClient(headers={"Authorization": f"Bearer {other}"}, timeout=60) as http:
        client = ClientFactory(ClientConfig(streaming=False, httpx_client=http)).create(card)
        try:
            await client.get_task(TaskQueryParams(id=out["send"]["id"]))
            out["other_tenant"] = "visible"
        except A2AClientJSONRPCError as e:
            out["other_tenant"] = rpc_error(e)
        try:
            await client.cancel_task(TaskIdParams(id=out["cancel"]["id"]))
            out["other_cancel"] = "accepted"
        except A2AClientJSONRPCError as e:
            out["other_cancel"] = rpc_error(e)
    print(json.dumps(out))


asyncio.run(main())
