"""An MCP client for hame's tests, written with the official Python SDK (`mcp`).

    python client.py stdio COMMAND [ARG...]     # starts `hame mcp serve ...` itself
    python client.py http URL [TOKEN]

It lists the tools and the prompts (gets the first, and an unknown one), asks `first` without a session, `second` in the session the first
answer named, sends two bad calls, and prints one JSON object with what it saw.
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


def dump(result):
    return {
        "is_error": bool(result.is_error),
        "texts": [c.text for c in result.content if getattr(c, "type", "") == "text"],
        "structured": result.structured_content,
    }


async def exercise(read, write):
    out = {}
    async with ClientSession(read, write) as session:
        init = await session.initialize()
        out["server"] = init.server_info.name
        out["instructions"] = init.instructions
        tools = await session.list_tools()
        out["tools"] = [
            {"name": t.name, "schema": t.input_schema, "description": t.description}
            for t in tools.tools
        ]
        prompts = await session.list_prompts()
        out["prompts"] = [
            {"name": p.name, "description": p.description} for p in prompts.prompts
        ]
        if prompts.prompts:
            got = await session.get_prompt(prompts.prompts[0].name)
            out["prompt"] = [m.content.text for m in got.messages]
        try:
            await session.get_prompt("no-such-skill")
            out["unknown_prompt"] = "no error"
        except Exception as e:  # the SDK raises McpError for a JSON-RPC error
            out["unknown_prompt"] = str(e)
        first = await session.call_tool("ask", {"message": "first"})
        out["first"] = dump(first)
        sid = (first.structured_content or {}).get("session")
        second = await session.call_tool("ask", {"message": "second", "session": sid})
        out["second"] = dump(second)
        bad = await session.call_tool("ask", {"message": "x", "session": "../../etc"})
        out["bad_session"] = dump(bad)
        extra = await session.call_tool("ask", {"message": "x", "model": "gpt"})
        out["extra_argument"] = dump(extra)
        try:
            await session.call_tool("nope", {})
            out["unknown_tool"] = "no error"
        except Exception as e:  # the SDK raises McpError for a JSON-RPC error
            out["unknown_tool"] = str(e)
    return out


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        params = StdioServerParameters(command=sys.argv[2], args=sys.argv[3:])
        async with stdio_client(params) as (read, write):
            out = await exercise(read, write)
    else:
        url = sys.argv[2]
        headers = {"Authorization": "Bearer " + sys.argv[3]} if len(sys.argv) > 3 else None
        async with create_mcp_http_client(headers=headers) as http:
            async with streamable_http_client(url, http_client=http) as streams:
                out = await exercise(streams[0], streams[1])
    print(json.dumps(out))


asyncio.run(main())
