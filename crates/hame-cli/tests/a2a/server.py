"""A tiny A2A agent served by the official A2A Python SDK (a2a-sdk 0.3), for hame's
remote subagents to call.

Usage: server.py LOG_FILE TOKEN STREAMING(1|0)
Prints `port N` once listening on 127.0.0.1. Every request needs
`Authorization: Bearer TOKEN` (else 401). Each task appends one JSON line to LOG_FILE
(its text, context id and the Authorization header it came with), then reports
`working`, adds the artifact `REMOTE ANSWER to: <text>` and completes; a text containing
`slow` waits 30 s first (so it can be cancelled: then `cancelled` is logged).
"""

import asyncio
import json
import socket
import sys

import uvicorn
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.apps import A2AStarletteApplication
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentSkill, Part, TextPart
from a2a.utils import new_task
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.responses import JSONResponse

LOG, TOKEN, STREAMING = sys.argv[1], sys.argv[2], sys.argv[3] == "1"


def log(entry):
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Echo(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task = context.current_task or new_task(context.message)
        await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, task.id, task.context_id)
        text = context.get_user_input()
        headers = context.call_context.state.get("headers", {}) if context.call_context else {}
        log({"text": text, "context_id": task.context_id, "auth": headers.get("authorization")})
        await updater.start_work(
            updater.new_agent_message([Part(root=TextPart(text="remote is working"))])
        )
        if "slow" in text:
            await asyncio.sleep(30)
        await updater.add_artifact(
            [Part(root=TextPart(text=f"REMOTE ANSWER to: {text}"))], name="answer"
        )
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        log({"cancelled": context.task_id})
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


async def auth(request, call_next):
    if request.headers.get("authorization") != f"Bearer {TOKEN}":
        return JSONResponse({"error": "unauthorized"}, status_code=401)
    return await call_next(request)


async def main():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    card = AgentCard(
        name="sdk-echo",
        description="Answers REMOTE ANSWER to whatever it is told",
        url=f"http://127.0.0.1:{port}/",
        version="1.0.0",
        capabilities=AgentCapabilities(streaming=STREAMING),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[
            AgentSkill(id="echo", name="echo", description="echoes", tags=["test"])
        ],
    )
    handler = DefaultRequestHandler(agent_executor=Echo(), task_store=InMemoryTaskStore())
    app = A2AStarletteApplication(agent_card=card, http_handler=handler).build(
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=auth)]
    )
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    print(f"port {port}", flush=True)
    await server.serve(sockets=[sock])


asyncio.run(main())
