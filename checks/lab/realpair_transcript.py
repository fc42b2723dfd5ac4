"""The real pair's transcript (test_realpair_lab.py, SPARKSTACK_REALPAIR_TRANSCRIPT=FILE) as the markdown section
docs/runbook-lab.md shows: `python checks/lab/realpair_transcript.py FILE > section.md`. The test's own directory is
shown as `.`; key lines are the last lines each command printed (its --json documents cut to what matters)."""

import json
import re
import sys


def shown(text: str) -> str:
    return re.sub(r"/tmp/pytest-of-[^/]+/pytest-\d+/(?:popen-gw\d+/)?realpair\d+/work/?", "./", text)


def render(doc: dict) -> str:
    out = []
    for stage in doc["stages"]:
        lines = [line for line in stage["key_lines"] if not line.lstrip().startswith(('"', "{", "}", "[", "]"))]
        out.append(f"### {stage['stage']} (exit {stage['exit']})\n\n```\n$ {shown(stage['command'])}\n"
                   + "".join(shown(line) + "\n" for line in lines) + "```\n")
    ranks = doc.get("ranks", {})
    out.append("### The two ranks\n\n| rank | host | container | image |\n|---|---|---|---|\n" + "".join(
        f"| {r} | {v['host']} | {v['container']} | {v['image'][:19]} |\n" for r, v in sorted(ranks.items())))
    chat = doc.get("chat", {})
    out.append(f"The head's answer at temperature 0: reasoning `{chat.get('reasoning')}`, content "
               f"`{chat.get('content')}`; `system_fingerprint` `{chat.get('system_fingerprint')}`.\n")
    bench = doc.get("bench", {})
    if bench:
        rows = "".join(f"| {k} | {bench['bench'][k]} | {bench['metrics_deltas'][k]} |\n"
                       for k in ("drafts", "draft_tokens", "accepted_tokens", "per_position"))
        out.append("bench's counters beside the head's own /metrics deltas around it (the test's scrapes):\n\n"
                   "| counter | bench | /metrics delta |\n|---|---|---|\n" + rows)
    return "\n".join(out)


if __name__ == "__main__":
    print(render(json.loads(open(sys.argv[1]).read())))
