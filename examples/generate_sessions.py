"""Write examples/sessions.jsonl: synthetic agent sessions for the demo and tests.

Each session is a short conversation between a user and a tool-using agent.
Users react the way real users do: they thank, correct, rephrase, or just go
on; tools succeed or fail. Main turns carry the prompt context and the
response; side turns (heartbeats, memory flushes) never become samples; some
sessions end with a ``session_end`` marker, some with a trailing ``message``.

    python examples/generate_sessions.py [--seed 7] [--sessions 50] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

SYSTEM = "You are a helpful agent. Use the tools when they help; answer concisely."

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": desc,
            "parameters": {"type": "object", "properties": {}},
        },
    }
    for name, desc in [
        ("read_file", "Read a file from the workspace"),
        ("run_shell", "Run a shell command in the workspace"),
        ("web_search", "Search the web"),
        ("get_weather", "Current weather for a city"),
        ("calendar_add", "Add an event to the user's calendar"),
    ]
]

# (user request, tool, args, tool success output, tool error output, good answer, bad answer)
TASKS = [
    (
        "What's in config/app.yaml?",
        "read_file",
        {"path": "config/app.yaml"},
        "port: 8080\nlog_level: info\n",
        "Error: file not found: config/app.yaml",
        "config/app.yaml sets port 8080 and log_level info.",
        "The file configures a database connection pool.",
    ),
    (
        "How many lines does main.py have?",
        "run_shell",
        {"cmd": "wc -l main.py"},
        "214 main.py",
        "bash: wc: command not found",
        "main.py has 214 lines.",
        "main.py is about 50 lines long.",
    ),
    (
        "Is it going to rain in Lisbon today?",
        "get_weather",
        {"city": "Lisbon"},
        '{"city": "Lisbon", "rain_probability": 0.7, "temp_c": 17}',
        '{"error": "upstream timeout"}',
        "Likely: there is a 70% chance of rain in Lisbon today, around 17 °C.",
        "No rain expected in Lisbon today, it will be sunny.",
    ),
    (
        "Book a dentist appointment on Friday at 3pm.",
        "calendar_add",
        {"title": "Dentist", "when": "Friday 15:00"},
        '{"status": "created", "id": "evt_81"}',
        '{"status": "error", "reason": "calendar is read-only"}',
        "Done: 'Dentist' is in your calendar on Friday at 15:00.",
        "I added the appointment for Thursday at 3pm.",
    ),
    (
        "Find the release date of Python 3.13.",
        "web_search",
        {"q": "Python 3.13 release date"},
        "Python 3.13.0 was released on October 7, 2024.",
        "HTTP 503 from search backend",
        "Python 3.13.0 was released on 7 October 2024.",
        "Python 3.13 came out in 2022.",
    ),
    (
        "Run the unit tests.",
        "run_shell",
        {"cmd": "pytest -q"},
        "42 passed in 3.1s",
        "ERROR: file or directory not found: tests/",
        "All 42 tests passed in 3.1 s.",
        "The tests ran, 3 failed.",
    ),
    (
        "Show me the TODOs in src/.",
        "run_shell",
        {"cmd": "grep -rn TODO src/"},
        "src/io.py:12: # TODO retry on EAGAIN\nsrc/api.py:88: # TODO paginate",
        "grep: src/: No such file or directory",
        "Two TODOs: src/io.py:12 (retry on EAGAIN) and src/api.py:88 (paginate).",
        "There are no TODOs in src/.",
    ),
    (
        "What's the weather in Oslo?",
        "get_weather",
        {"city": "Oslo"},
        '{"city": "Oslo", "rain_probability": 0.1, "temp_c": -3}',
        '{"error": "unknown city"}',
        "Oslo: -3 °C with a 10% chance of rain.",
        "Oslo is warm today, about 20 °C.",
    ),
]

THANKS = [
    "Thanks, that's exactly it.",
    "Perfect, thank you!",
    "Great, that helps.",
    "Nice, thanks. Next question then.",
]
CORRECTIONS = [
    "No, that's wrong. Look at the tool output again.",
    "That's not what the output says. Please redo it.",
    "Incorrect. Check again and fix your answer.",
]
REPHRASES = [
    "Let me rephrase: I need the exact figure from the tool.",
    "I meant: tell me precisely what the result was.",
    "Again, more carefully this time please.",
]
NEUTRAL = ["ok", "Hmm, alright.", "I see."]


def _assistant_tool_call(call_id: str, tool: str, args: dict) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": tool, "arguments": json.dumps(args)},
            }
        ],
    }


class SessionWriter:
    """Builds one session's events, keeping the conversation and turn numbering."""

    def __init__(self, session_id: str, rng: random.Random, t0: float) -> None:
        self.session_id = session_id
        self.rng = rng
        self.ts = t0
        self.turn_index = 0
        self.history: list[dict] = [{"role": "system", "content": SYSTEM}]
        self.events: list[dict] = []

    def _tick(self) -> float:
        self.ts += self.rng.uniform(0.5, 20.0)
        return round(self.ts, 3)

    def turn(self, response: dict, turn_type: str = "main") -> None:
        self.events.append(
            {
                "type": "turn",
                "schema_version": 1,
                "session_id": self.session_id,
                "turn_index": self.turn_index,
                "turn_type": turn_type,
                "messages": [dict(m) for m in self.history],
                "response": response,
                "tools": TOOLS,
                "policy_version": 0,
                "ts": self._tick(),
            }
        )
        self.turn_index += 1
        if turn_type == "main":
            self.history.append({"role": "assistant", **response})

    def side_turn(self) -> None:
        kind = self.rng.choice(["heartbeat", "memory flush"])
        prompt = {"role": "user", "content": f"[{kind}] summarise the session state briefly."}
        self.events.append(
            {
                "type": "turn",
                "schema_version": 1,
                "session_id": self.session_id,
                "turn_index": self.turn_index,
                "turn_type": "side",
                "messages": [*self.history, prompt],
                "response": {"content": "State: working on the user's request."},
                "ts": self._tick(),
            }
        )
        self.turn_index += 1

    def add(self, message: dict) -> None:
        self.history.append(message)

    def message_event(self, message: dict) -> None:
        self.events.append(
            {
                "type": "message",
                "schema_version": 1,
                "session_id": self.session_id,
                "message": message,
                "ts": self._tick(),
            }
        )

    def end(self) -> None:
        self.events.append(
            {
                "type": "session_end",
                "schema_version": 1,
                "session_id": self.session_id,
                "ts": self._tick(),
            }
        )


def _task_episode(w: SessionWriter, task: tuple, call_no: int, reaction: str) -> str:
    """One request → tool call → tool result → answer; returns the user's reaction.

    ``reaction`` (to the previous answer) opens the request, so it is the last
    message of the next main turn: the previous turn's next state.
    """
    request, tool, args, ok_out, err_out, good, bad = task
    rng = w.rng
    w.add({"role": "user", "content": f"{reaction} {request}".strip()})
    call_id = f"call_{w.session_id[-4:]}_{call_no}"
    call = _assistant_tool_call(call_id, tool, args)
    w.turn({"content": None, "tool_calls": call["tool_calls"]})
    tool_failed = rng.random() < 0.25
    w.add(
        {
            "role": "tool",
            "tool_call_id": call_id,
            "name": tool,
            "content": err_out if tool_failed else ok_out,
        }
    )
    if rng.random() < 0.3:
        w.side_turn()
    if tool_failed:
        answer = rng.choice([f"The {tool} call failed: {err_out}", bad])
        w.turn({"content": answer})
        return rng.choice(REPHRASES + CORRECTIONS)
    answer_is_good = rng.random() < 0.65
    w.turn({"content": good if answer_is_good else bad})
    if answer_is_good:
        return rng.choice(THANKS + NEUTRAL[:1])
    return rng.choice(CORRECTIONS + REPHRASES)


def make_session(index: int, rng: random.Random, t0: float) -> list[dict]:
    w = SessionWriter(f"demo-{index:03d}", rng, t0)
    episodes = rng.randint(1, 3)
    reaction = ""
    for n in range(episodes):
        reaction = _task_episode(w, rng.choice(TASKS), n, reaction)
        if n < episodes - 1 and reaction in CORRECTIONS + REPHRASES and rng.random() < 0.5:
            # The user pushes back; the agent answers that before the next request.
            w.add({"role": "user", "content": reaction})
            w.turn({"content": "Sorry about that, I'll re-check the output."})
            reaction = rng.choice(NEUTRAL)
    ending = rng.random()
    if ending < 0.5:
        w.message_event({"role": "user", "content": reaction})
        w.end()
    elif ending < 0.8:
        w.end()  # the last turn has no next state
    else:
        w.message_event({"role": "user", "content": reaction})  # idle, no end marker
    return w.events


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("sessions.jsonl"))
    args = parser.parse_args()
    rng = random.Random(args.seed)
    t0 = 1_790_000_000.0
    lines = []
    for i in range(args.sessions):
        lines.extend(make_session(i, rng, t0 + i * 60.0))
    args.out.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in lines))
    print(f"wrote {len(lines)} events of {args.sessions} sessions to {args.out}")


if __name__ == "__main__":
    main()
