"""Size of the first request's system prompt + tool schemas: characters, and chars/4 (the benchmark's token estimate)."""
import json, sys, glob
d = sys.argv[1]
first = sorted(glob.glob(d + "/*.json"))[0]
b = json.load(open(first))
system = "".join(m["content"] if isinstance(m["content"], str) else json.dumps(m["content"]) for m in b["messages"] if m["role"] == "system")
tools = b.get("tools", [])
tj = len(json.dumps(tools, separators=(",", ":")))
print(json.dumps({"tools": len(tools), "system_chars": len(system), "tools_json_chars": tj, "est_tokens": (len(system) + tj) // 4, "names": [t["function"]["name"] for t in tools]}))
