"""A real MCP server for hame's tests, written with the official Python SDK (`mcp`).

    python server.py stdio [PIDFILE]
    python server.py http PORT
"""

import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("hame-test")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def echo(text: str) -> str:
    """Echo the text back, upper-cased."""
    return text.upper()


@server.tool()
def secret() -> str:
    """The MCP_SECRET environment variable of the server."""
    return "secret=" + os.environ.get("MCP_SECRET", "(unset)")


@server.tool()
def header(ctx: Context) -> str:
    """The x-hame-test request header the server received."""
    headers = ctx.headers or {}
    return "header=" + str(headers.get("x-hame-test", "(none)"))


@server.tool()
def trace(ctx: Context) -> str:
    """The W3C trace context the request carried in `_meta` (MCP SEP-414) and, over HTTP,
    in the `traceparent` header."""
    meta = ctx.request_context.meta
    if meta is None:
        parent = None
    elif isinstance(meta, dict):
        parent = meta.get("traceparent")
    else:
        parent = getattr(meta, "traceparent", None) or (getattr(meta, "model_extra", None) or {}).get("traceparent")
    headers = ctx.headers or {}
    return "traceparent=" + str(parent) + " header=" + str(headers.get("traceparent", "(none)"))


@server.tool()
def fail(reason: str) -> str:
    """Always fails."""
    raise ToolError("refused: " + reason)


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def big(mib: float) -> str:
    """A text of `mib` MiB of the letter x."""
    return "x" * int(mib * (1 << 20))


def grown() -> str:
    """A tool added at run time."""
    return "grown"


@server.tool()
async def grow(ctx: Context) -> str:
    """Adds the tool `grown` and tells the client its tool list changed."""
    server.add_tool(grown)
    await ctx.session.send_tool_list_changed()
    return "added"


if os.environ.get("HAME_TEST_MCP_COLLIDE"):
    # Names that providers do not accept as they are, and that collided before hame
    # gave changed names a hash suffix: each tool says which one it is.
    LONG = "a_tool_name_that_goes_on_and_on_past_the_limit_of_64_characters_"

    def named(name):
        def tool() -> str:
            return "I am " + name

        server.add_tool(tool, name=name, description="Says its name.")

    for n in ["dot.name", "dot_name", LONG + "one", LONG + "two"]:
        named(n)


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    print("hame-test MCP server starting", file=sys.stderr, flush=True)
    if mode == "http":
        server.run(transport="streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        if len(sys.argv) > 2:
            with open(sys.argv[2], "w") as f:
                f.write(str(os.getpid()))
        server.run()
