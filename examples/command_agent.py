#!/usr/bin/env python3
"""A command agent for Crewlet (docs/agents.md § The command agent).

The node writes one JSON object per line to stdin; this answers one JSON
object per line on stdout. Each turn takes two rounds: round 1 asks for a
diary note and an outbound post echoing the triggers — and, when the seat
has an MCP time server (a tool named `time.get_current_time` in the turn's
`tools`, docs/agents.md § Tools), the current time in UTC — and when the results
come back the turn is done. Anything else is ignored; EOF ends the program.
"""

import json
import os
import sys

SEAT = os.environ.get("CREWLET_SEAT", "?")


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def on_turn(turn):
    ids = [trigger["id"] for trigger in turn["triggers"]]
    offered = {tool["name"]: tool for tool in turn.get("tools", [])}
    note = (f"{SEAT} took turn {turn['turn_id']} for {len(ids)} trigger(s); "
            f"{len(offered)} tools offered")
    calls = [
        {"id": "diary", "name": "diary_write", "args": {"text": note}},
        {"id": "post", "name": "post_outbox",
         "args": {"text": "echo of " + ", ".join(ids)}},
    ]
    # A read-only tool (annotations.read_only): calling it proves nothing
    # reached outside, so a turn that then broke would simply run again.
    if "time.get_current_time" in offered:
        calls.append({"id": "now", "name": "time.get_current_time",
                      "args": {"timezone": "UTC"}})
    send({"type": "calls", "turn_id": turn["turn_id"], "calls": calls})


def on_results(message):
    failed = [r["id"] for r in message["results"] if not r["ok"]]
    send({
        "type": "done",
        "turn_id": message["turn_id"],
        "result": {"echoed": not failed, "failed": failed},
    })


def main():
    for line in sys.stdin:
        try:
            message = json.loads(line)
        except json.JSONDecodeError:
            continue  # a blank or torn line
        kind = message.get("type")
        if kind == "turn":
            on_turn(message["turn"])
        elif kind == "results":
            on_results(message)
        # "abort" and unknown types: nothing is kept per turn, nothing to do.


if __name__ == "__main__":
    main()
