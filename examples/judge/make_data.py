"""Labelled data for training and evaluating the small judge (SmolLM2-135M fine-tuned).

``python examples/judge/make_data.py`` rewrites ``train.jsonl`` and ``heldout.jsonl`` next
to this file: gold items (the ``turnstream judge agreement`` format) that score an
assistant output by its next state, as OpenClaw-RL's PRM judge does. +1: thanks,
confirmation or moving on to a new request, or a tool success. -1: correction, redo,
rephrased request or a request to shorten or reformat, or a tool error. 0: vague,
unrelated or inconclusive. Every user -1 item carries a ``hint``: what the next state
revealed, as an instruction the assistant could have followed beforehand.

The two splits share no task, assistant output, reply phrasing, correction template or
tool-output shape: each split draws every template slot from its own pool, and the
script asserts that no task, assistant output or next-state text occurs in both, so the
held-out score measures judging rather than recall of training sentences.

In the train split, thanks, vague and unrelated replies follow any assistant output,
wrong and long ones too (``OUTPUTS_FOR_ANY_REPLY``): were wrong outputs only ever
followed by corrections, a judge could score the output it recognises and ignore the
reply, which no held-out output rewards. The held-out split is drawn as it was first
written, so its figures compare across versions of the training data.
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SEED = 1729
SIZES = {"train": 500, "heldout": 150}
# Share of each (role, label) cell: 30% user +1, 30% user -1, 12% user 0, 15% tool +1,
# 10% tool -1, 3% tool 0.
MIX = {
    ("user", 1): 0.30,
    ("user", -1): 0.30,
    ("user", 0): 0.12,
    ("tool", 1): 0.15,
    ("tool", -1): 0.10,
    ("tool", 0): 0.03,
}
# How a user cell splits into categories.
USER_SPLIT = {
    1: {"user_confirm": 0.55, "user_move_on": 0.45},
    -1: {"user_correction": 0.40, "user_redo": 0.17, "user_rephrase": 0.17, "user_shorten": 0.26},
    0: {"user_vague": 0.67, "user_unrelated": 0.33},
}
# Splits whose thanks, vague and unrelated replies follow any output, wrong and long ones too
# (the held-out split is kept as it was first written, so its figures stay comparable).
OUTPUTS_FOR_ANY_REPLY = {"train"}
MAX_WORDS = {"task": 30, "output": 90, "next": 60}
MAX_TOOL_LINES = 12


@dataclass(frozen=True)
class Good:
    """A task answered correctly, and new requests a satisfied user might move on to."""

    task: str
    output: str
    follow_ups: tuple[str, ...]


@dataclass(frozen=True)
class Mistake:
    """A task answered wrongly. ``right``/``wrong`` fill correction templates; ``fixes``
    are hand-written corrections; ``rephrase`` asks for the same thing in other words."""

    task: str
    output: str
    hint: str
    rephrase: str
    right: str | None = None
    wrong: str | None = None
    fixes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Long:
    """A task answered at length (40–90 words); ``kind`` is prose, code or number."""

    task: str
    output: str
    kind: str


@dataclass(frozen=True)
class Form:
    """A request to shorten or change the form of an answer, the hint it implies, and
    the kinds of long answer it fits."""

    reply: str
    hint: str
    kinds: frozenset[str]


@dataclass(frozen=True)
class Action:
    """A task done by one tool call, and outputs (templates) that only this call gives."""

    task: str
    say: str
    tool: str
    args: dict[str, Any]
    params: dict[str, str] = field(default_factory=dict)
    outputs: dict[int, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolKind:
    """Calls of one kind and the output templates they share, by label."""

    actions: tuple[Action, ...]
    outputs: dict[int, tuple[str, ...]]


@dataclass(frozen=True)
class Pools:
    """Every template slot of one split."""

    good: tuple[Good, ...]
    mistakes: tuple[Mistake, ...]
    longs: tuple[Long, ...]
    forms: tuple[Form, ...]
    thanks: tuple[str, ...]
    move_on: tuple[str, ...]
    corrections: tuple[str, ...]
    redo: tuple[str, ...]
    vague: tuple[str, ...]
    unrelated: tuple[str, ...]
    tools: tuple[ToolKind, ...]
    fill: dict[str, tuple[str, ...]]


ALL = frozenset({"prose", "code", "number"})


def kinds(*names: str) -> frozenset[str]:
    return frozenset(names)


def G(task: str, output: str, *follow_ups: str) -> Good:
    return Good(task, output, follow_ups)


def A(
    task: str,
    say: str,
    tool: str,
    args: dict[str, Any],
    *,
    ok: Sequence[str] = (),
    err: Sequence[str] = (),
    vague: Sequence[str] = (),
    **params: str,
) -> Action:
    outputs = {label: tuple(texts) for label, texts in ((1, ok), (-1, err), (0, vague)) if texts}
    return Action(task, say, tool, args, params, outputs)


def sh(cmd: str) -> dict[str, Any]:
    return {"cmd": cmd}


# The train split's pools.
# fmt: off

TRAIN_GOOD = (
    G("Write a Python function that reverses a string.",
      "def reverse(s: str) -> str:\n    return s[::-1]",
      "add a docstring to it", "write a unit test for it"),
    G("How do I read a JSON file in Python?",
      "Use the json module:\n\nimport json\nwith open('data.json') as f:\n    data = json.load(f)",
      "show me how to write it back with indentation", "add handling for a missing file"),
    G("Write a regex that matches a US ZIP code.",
      "^\\d{5}(-\\d{4})?$ matches five digits, optionally followed by a hyphen and four more.",
      "write one for Canadian postal codes", "show how to use it with re.fullmatch"),
    G("Turn this loop into a list comprehension: for x in nums: if x > 0: out.append(x * 2)",
      "out = [x * 2 for x in nums if x > 0]",
      "do the same with a generator expression", "explain when a plain loop is clearer"),
    G("What's the difference between a list and a tuple in Python?",
      "A list is mutable: you can add, remove or change items. A tuple is immutable, so it "
      "can be a dict key and signals fixed data.",
      "explain what a frozenset is", "compare dicts and namedtuples the same way"),
    G("Write a SQL query that counts orders per customer.",
      "SELECT customer_id, COUNT(*) AS orders\nFROM orders\nGROUP BY customer_id;",
      "sort it by the count, highest first", "keep only customers with more than five orders"),
    G("Add type hints to: def area(r): return 3.14159 * r * r",
      "def area(r: float) -> float:\n    return 3.14159 * r * r",
      "replace 3.14159 with math.pi", "add a check that r is not negative"),
    G("How do I undo my last git commit but keep the changes?",
      "Run git reset --soft HEAD~1. The commit is removed and its changes stay staged.",
      "tell me how to unstage them too", "explain how to push after rewriting history"),
    G("Write a JavaScript function that returns the largest number in an array.",
      "const max = (arr) => Math.max(...arr);\n\nFor very large arrays use "
      "arr.reduce((a, b) => (a > b ? a : b)).",
      "make it return null for an empty array", "write the TypeScript version"),
    G("Explain what a Python decorator is in two sentences.",
      "A decorator is a function that takes another function and returns a wrapped version "
      "of it. It adds behaviour such as logging or caching without editing the original.",
      "show a tiny example of one", "explain what functools.wraps does"),
    G("Fix this: def avg(xs): return sum(xs) / len(xs) crashes on an empty list.",
      "def avg(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n\nAn empty list now returns "
      "0.0 instead of raising ZeroDivisionError.",
      "make it return None instead", "add a test for the empty case"),
    G("Write a Dockerfile for a small Flask app.",
      "FROM python:3.12-slim\nWORKDIR /app\nCOPY requirements.txt .\nRUN pip install -r "
      "requirements.txt\nCOPY . .\nCMD [\"flask\", \"run\", \"--host=0.0.0.0\"]",
      "add a non-root user to it", "write a docker-compose file for it"),
    G("How do I find all .log files bigger than 100 MB?",
      "find / -name '*.log' -size +100M 2>/dev/null",
      "delete the ones older than 30 days", "show their sizes as well"),
    G("Give me a command that counts the lines in all .py files.",
      "find . -name '*.py' | xargs wc -l",
      "exclude the venv folder", "sort the files by line count"),
    G("How do I see which process is using port 8080?",
      "sudo lsof -i :8080 shows the process and its PID. Without lsof, use ss -ltnp | grep 8080.",
      "tell me how to kill that process", "turn it into a small script"),
    G("What's the command to make script.sh executable?",
      "chmod +x script.sh",
      "show me how to run it in the background", "make it run at boot"),
    G("How do I compress a folder into a tar.gz?",
      "tar -czf backup.tar.gz folder/",
      "show how to extract it somewhere else", "exclude the node_modules folder"),
    G("Show the disk usage of each folder in the current directory.",
      "du -sh */ | sort -h",
      "include hidden folders", "show only the five biggest"),
    G("In pandas, how do I drop rows with missing values?",
      "df = df.dropna()\n\nUse df.dropna(subset=['col']) to look at one column only.",
      "fill them with the column mean instead", "count the missing values per column"),
    G("How do I merge two DataFrames on a user_id column?",
      "merged = pd.merge(left, right, on='user_id', how='inner')",
      "make it a left join", "handle columns that share a name"),
    G("Compute the median of 3, 9, 4, 7, 12.",
      "Sorted: 3, 4, 7, 9, 12. The median is 7.",
      "give me the mean too", "compute the standard deviation"),
    G("Convert this CSV row to JSON: name,age / Ana,31",
      "{\"name\": \"Ana\", \"age\": 31}",
      "do it for a list of rows", "write a Python script for whole files"),
    G("Which chart fits monthly sales over two years?",
      "A line chart: months on the x-axis, sales on the y-axis, one line per year so the "
      "seasons line up.",
      "suggest colours for the two lines", "recommend a chart for sales by region"),
    G("Group sales by region and sum the revenue in pandas.",
      "df.groupby('region')['revenue'].sum().reset_index()",
      "sort the regions by revenue", "plot it as a bar chart"),
    G("Write a subject line for an email announcing our new office.",
      "We're moving: say hello to our new office",
      "write the first paragraph of the email", "give me a more formal version"),
    G("Rewrite this more politely: Send me the report now.",
      "Could you send me the report when you have a moment? Thank you.",
      "make it a bit more urgent", "translate it into Spanish"),
    G("Give me a formal synonym for 'important' for a report.",
      "Significant: 'These results are significant for the next quarter.'",
      "give me two more options", "suggest a formal word for 'use'"),
    G("Write a one-line bio for a freelance photographer.",
      "Freelance photographer capturing weddings, portraits and city life with a "
      "documentary eye.",
      "write a version for LinkedIn", "add a call to action"),
    G("Proofread: Their going to the meeting tomorow.",
      "They're going to the meeting tomorrow.",
      "check this one too: Its a good idea", "explain their, there and they're briefly"),
    G("Write a haiku about autumn rain.",
      "Cold rain on the roof\nmaple leaves drown in puddles\nthe kettle whistles",
      "write one about winter", "translate it into French"),
    G("What is the capital of Canada?",
      "Ottawa is the capital of Canada.",
      "tell me its population", "do the same for New Zealand"),
    G("Who wrote 'Pride and Prejudice'?",
      "Jane Austen wrote it; it was published in 1813.",
      "list her other novels", "recommend a similar book"),
    G("How many bones are in the adult human body?",
      "An adult human has 206 bones.",
      "tell me how many a newborn has", "name the smallest one"),
    G("What's the boiling point of water in Fahrenheit?",
      "212 °F at sea level.",
      "give it in Kelvin too", "explain how altitude changes it"),
    G("What is the chemical symbol for gold?",
      "Au, from the Latin aurum.",
      "give me the symbol for silver", "tell me its atomic number"),
    G("When did the Berlin Wall fall?",
      "On 9 November 1989.",
      "tell me when it was built", "summarise why it fell"),
    G("What's the largest planet in the solar system?",
      "Jupiter.",
      "tell me how many moons it has", "name the second largest"),
    G("Schedule a 30-minute sync with Priya on Tuesday at 10am.",
      "Done: 'Sync with Priya', Tuesday 10:00–10:30, invite sent to Priya.",
      "add a video link to it", "set a reminder 10 minutes before"),
    G("What day of the week was 1 March 2024?",
      "1 March 2024 was a Friday.",
      "check 1 March 2025 as well", "count the days to it from 1 January"),
    G("Remind me to call the dentist tomorrow at 9.",
      "Reminder set: 'Call the dentist', tomorrow at 09:00.",
      "remind me to buy milk at 6pm as well", "move the dentist reminder to 9:30"),
    G("Convert 3pm London time to New York time.",
      "3pm in London is 10am in New York, which is five hours behind.",
      "convert it to Tokyo time", "explain what changes around the March clock change"),
    G("Block two hours on Friday afternoon for deep work.",
      "Blocked Friday 14:00–16:00 as 'Deep work', marked busy.",
      "do the same for next Friday", "decline any meetings in that slot"),
    G("How many working days are there from 1 to 14 June 2024?",
      "Ten: 3–7 June and 10–14 June (1 June 2024 is a Saturday).",
      "count the weekend days too", "do the same for July"),
    G("What is 15% of 240?",
      "15% of 240 is 36.",
      "add 15% to 240", "work out 18% of 240"),
    G("Solve 2x + 6 = 20.",
      "2x = 14, so x = 7.",
      "solve 3x - 5 = 16", "check it by substitution"),
    G("What's the derivative of x^3?",
      "d/dx x^3 = 3x^2.",
      "integrate it back", "differentiate sin(x^2)"),
    G("Is 97 a prime number?",
      "Yes. 97 is not divisible by 2, 3, 5 or 7, and 10² > 97, so it is prime.",
      "find the next prime after it", "list the primes below 30"),
    G("What's the area of a circle with radius 4 cm?",
      "A = πr² = 16π ≈ 50.27 cm².",
      "give its circumference", "do it for radius 6"),
    G("Convert 0.375 to a fraction.",
      "0.375 = 3/8.",
      "convert 0.625 too", "write it as a percentage"),
    G("What's the average of 12, 15 and 21?",
      "(12 + 15 + 21) / 3 = 16.",
      "find the median", "add 30 to the list and recompute"),
    G("Explain HTTP 404 versus 410.",
      "404 Not Found means nothing is at that URL right now. 410 Gone means it existed and "
      "was removed on purpose, so clients can forget it.",
      "explain 301 versus 302", "tell me which my deleted blog posts should return"),
    G("Write a cron line that runs backup.sh every day at 2am.",
      "0 2 * * * /path/to/backup.sh",
      "make it weekdays only", "log its output to a file"),
    G("Suggest a name for a to-do list app.",
      "Tickd: short, memorable, and it hints at checking things off.",
      "write a tagline for it", "suggest a colour scheme"),
    G("Translate 'good morning' into German.",
      "Guten Morgen.",
      "tell me how to say good night", "give it in Italian"),
    G("What's the time complexity of binary search?",
      "O(log n): each step halves the search range.",
      "compare it with linear search", "explain why it needs sorted input"),
    G("Give me the git command to create and switch to a branch named feature/login.",
      "git switch -c feature/login",
      "push it to origin and track it", "show how to delete it later"),
    G("Give me a quick recipe idea with chickpeas and spinach.",
      "Chickpea and spinach curry: fry onion, garlic and curry paste, add chickpeas and "
      "tomatoes, simmer 10 minutes, stir in the spinach until wilted. Serve with rice.",
      "make it without tomatoes", "suggest a side dish"),
    G("How do I centre a div horizontally with CSS?",
      ".box { margin: 0 auto; width: 300px; }\n\nOr on the parent: display: flex; "
      "justify-content: center;",
      "centre it vertically too", "do it with CSS grid"),
    G("Give me a shell line that sets the log level to debug.",
      "export LOG_LEVEL=debug",
      "make it permanent in .bashrc", "give the PowerShell version"),
    G("What does HTTP status 201 mean?",
      "201 Created: the request succeeded and a new resource was created, usually with its "
      "URL in the Location header.",
      "explain 202 as well", "tell me when to return 204"),
)

TRAIN_MISTAKES = (
    Mistake("What is the capital of Australia?", "The capital of Australia is Sydney.",
            "The capital of Australia is Canberra, not Sydney; answer Canberra.",
            "Which city is Australia's capital, the seat of government?", "Canberra", "Sydney"),
    Mistake("Restart the web server.", "Done: I restarted the PostgreSQL database service.",
            "The user wanted the web server (nginx) restarted, not the database; restart nginx.",
            "I need nginx, the web server, restarted.", "the web server", "the database"),
    Mistake("How many legs does a spider have?", "Spiders have six legs.",
            "Spiders have eight legs; insects have six. Answer eight.",
            "What's the number of legs on a spider?", "eight", "six"),
    Mistake("Who wrote '1984'?", "'1984' was written by Aldous Huxley.",
            "'1984' was written by George Orwell; Huxley wrote 'Brave New World'.",
            "Which author wrote the novel Nineteen Eighty-Four?", "George Orwell",
            "Aldous Huxley"),
    Mistake("What is 12 × 13?", "12 × 13 = 146.",
            "12 × 13 = 156 (120 + 36); multiply carefully and answer 156.",
            "Multiply twelve by thirteen for me.", "156", "146"),
    Mistake("Sort [5, 2, 9, 1] in descending order.", "[1, 2, 5, 9]",
            "The user asked for descending order; return [9, 5, 2, 1], largest first.",
            "Largest first, please: sort 5, 2, 9, 1.", "[9, 5, 2, 1]", "[1, 2, 5, 9]"),
    Mistake("Delete the temp folder in my home directory.", "Removed ~/Downloads and its contents.",
            "Only ~/temp was to be deleted; remove exactly the folder named and nothing else.",
            "I meant the folder called temp in my home directory.", "~/temp", "~/Downloads"),
    Mistake("What year did World War II end?", "World War II ended in 1944.",
            "World War II ended in 1945; answer 1945.",
            "When exactly did WWII come to an end?", "1945", "1944"),
    Mistake("Convert 100 °F to Celsius.", "100 °F is about 55.6 °C.",
            "Use C = (F − 32) × 5/9: 100 °F is about 37.8 °C.",
            "How much is 100 Fahrenheit in degrees Celsius?", "about 37.8 °C", "55.6 °C"),
    Mistake("Write a Python function that returns the last element of a list.",
            "def last(xs):\n    return xs[0]",
            "Return the last element with xs[-1]; xs[0] is the first element.",
            "The function should give back the list's final item.", "xs[-1]", "xs[0]"),
    Mistake("What's the chemical formula for table salt?", "Table salt is KCl.",
            "Table salt is sodium chloride, NaCl; KCl is potassium chloride.",
            "What's the formula of sodium chloride, the salt on the table?", "NaCl", "KCl"),
    Mistake("Schedule the team standup for 9:30 every weekday.",
            "Created 'Team standup' at 9:30 every day, weekends included.",
            "The standup repeats on weekdays only (Monday to Friday), not every day.",
            "Make the standup Monday to Friday at 9:30.", "weekdays only", "every day"),
    Mistake("What's the square root of 169?", "The square root of 169 is 14.",
            "The square root of 169 is 13, since 13 × 13 = 169.",
            "Which number times itself gives 169?", "13", "14"),
    Mistake("Give me the git command that lists all branches, remote ones included.",
            "git branch",
            "Use git branch -a to include remote branches; plain git branch lists local ones.",
            "How do I see the remote branches as well as the local ones?", "git branch -a",
            "git branch"),
    Mistake("Translate 'thank you' into Japanese.", "'Thank you' in Japanese is 'konnichiwa'.",
            "'Thank you' in Japanese is 'arigatou (gozaimasu)'; 'konnichiwa' means hello.",
            "How do you say thanks in Japanese?", "arigatou", "konnichiwa"),
    Mistake("Which planet is closest to the sun?", "Venus is the closest planet to the sun.",
            "Mercury is the planet closest to the sun; answer Mercury.",
            "Which planet orbits nearest to the sun?", "Mercury", "Venus"),
    Mistake("Rename report.txt to report_final.txt.",
            "Done: report_final.txt has been renamed to report.txt.",
            "Rename report.txt to report_final.txt: old name first, new name second.",
            "The file called report.txt needs the name report_final.txt.",
            fixes=("Other way round: report.txt should become report_final.txt.",
                   "thanks, but you flipped it. The new name is report_final.txt")),
    Mistake("Email the draft to Maria.", "Sent the draft to Mario (mario@acme.com).",
            "The draft was for Maria, not Mario; check the recipient's name before sending.",
            "Send the draft to Maria, maria@acme.com.", "Maria", "Mario"),
    Mistake("How many days are in a leap year?", "A leap year has 365 days.",
            "A leap year has 366 days; answer 366.",
            "What's the day count of a leap year?", "366", "365"),
    Mistake("Find the bug: for i in range(len(xs) + 1): print(xs[i])",
            "The loop looks correct; it prints every element of xs.",
            "range(len(xs) + 1) runs one past the end, so xs[i] raises IndexError; point out "
            "the off-by-one and use range(len(xs)).",
            "Why does this loop crash on its last pass?",
            fixes=("It raises IndexError on the last iteration, the range goes one too far.",
                   "Look again: xs[len(xs)] is out of range.")),
    Mistake("What's the tallest mountain in Africa?",
            "Mount Kenya is the tallest mountain in Africa.",
            "Kilimanjaro (5,895 m) is Africa's tallest mountain; answer Kilimanjaro.",
            "Which African mountain is the highest?", "Kilimanjaro", "Mount Kenya"),
    Mistake("Book a table for four at 7pm on Saturday.",
            "Booked a table for two at 7pm on Saturday at Luigi's.",
            "The booking is for four people; book a table for four, not two.",
            "We're a party of 4 on Saturday at 7pm, please book that.", "four people", "two",
            ("Thanks, but I said four of us.",)),
    Mistake("What's 2 to the power of 10?", "2^10 = 1000.",
            "2^10 = 1024, not 1000; compute powers of two exactly.",
            "What do you get when you raise 2 to the 10th?", "1024", "1000"),
    Mistake("In Python, how do I get the number of keys in a dict d?",
            "Use d.length to get the number of keys.",
            "In Python the size of a dict is len(d); there is no .length attribute.",
            "Which built-in gives how many keys a dict has?", "len(d)", "d.length",
            ("That raises AttributeError. It's len(d).",)),
    Mistake("Who was the first person to walk on the moon?",
            "Buzz Aldrin was the first person to walk on the moon.",
            "Neil Armstrong was first on the moon; Buzz Aldrin followed him.",
            "Who stepped onto the moon first in 1969?", "Neil Armstrong", "Buzz Aldrin"),
    Mistake("Set my alarm for 6:45 tomorrow.", "Alarm set for 7:45 tomorrow.",
            "The alarm should be at 6:45, not 7:45; use the exact time the user gave.",
            "I need to wake at quarter to seven tomorrow.", "6:45", "7:45"),
    Mistake("What's the plural of 'mouse', the animal?", "The plural is 'mouses'.",
            "The plural of mouse (the animal) is 'mice'.",
            "If there's more than one mouse, what do I call them?", "mice", "mouses"),
    Mistake("Write a SQL query that selects users older than 30.",
            "SELECT * FROM users WHERE age < 30;",
            "Use WHERE age > 30; the query selected users younger than 30.",
            "Only users whose age is above 30, please.", "age > 30", "age < 30",
            ("That's younger than 30; I want age > 30.",)),
    Mistake("How many continents are there?", "There are five continents.",
            "By the usual convention there are seven continents; answer seven.",
            "What's the usual count of continents?", "seven", "five"),
    Mistake("Convert 5 km to miles.", "5 km is about 8.05 miles.",
            "1 km ≈ 0.621 miles, so 5 km ≈ 3.11 miles; 8.05 converts the other way.",
            "How far is 5 kilometres in miles?", "about 3.11 miles", "8.05 miles"),
    Mistake("Which HTTP method is idempotent, POST or PUT?", "POST is idempotent; PUT is not.",
            "PUT is idempotent and POST is not; answer PUT.",
            "Between POST and PUT, which can be repeated with the same result?", "PUT", "POST"),
    Mistake("Install the requests library.", "Ran npm install requests.",
            "requests is a Python library; install it with pip install requests, not npm.",
            "I need the Python requests package installed.",
            fixes=("requests is a Python package, use pip.",
                   "Thanks, but I meant pip install requests, not npm.")),
    Mistake("What's the largest ocean?", "The Atlantic is the largest ocean.",
            "The Pacific is the largest ocean; answer the Pacific.",
            "Which ocean is the biggest by area?", "the Pacific", "the Atlantic"),
    Mistake("Move my meeting with Chen to next Wednesday.",
            "Moved the meeting with Chen to next Tuesday, same time.",
            "The meeting with Chen moves to next Wednesday, not Tuesday.",
            "Chen's meeting needs to be on Wednesday next week.", "Wednesday", "Tuesday"),
    Mistake("What does CPU stand for?", "CPU stands for Computer Processing Unit.",
            "CPU stands for Central Processing Unit.",
            "Spell out the acronym CPU for me.", "Central Processing Unit",
            "Computer Processing Unit"),
    Mistake("Give me the regex for one or more digits.", "Use \\d? to match one or more digits.",
            "One or more digits is \\d+; \\d? matches zero or one digit.",
            "Which regex matches a run of at least one digit?", "\\d+", "\\d?"),
    Mistake("What's the capital of Brazil?", "The capital of Brazil is Rio de Janeiro.",
            "Brazil's capital is Brasília (since 1960), not Rio de Janeiro.",
            "Which city is Brazil's capital today?", "Brasília", "Rio de Janeiro"),
    Mistake("Write a haiku about the sea.",
            "Waves crash on the shore,\nseagulls cry above the sand,\nthe tide slowly turns "
            "back home.",
            "A haiku has 5-7-5 syllables; the last line must have five, not seven.",
            "I need a proper haiku about the sea: five, seven, five syllables.",
            fixes=("That's not 5-7-5, the last line has seven syllables.",
                   "Third line should be five syllables.")),
    Mistake("What's 3/4 as a percentage?", "3/4 is 34%.",
            "3/4 = 0.75 = 75%.", "Express three quarters as a percent.", "75%", "34%"),
    Mistake("Check out the main branch.",
            "Ran git checkout -b main, which created a new branch called main.",
            "main already exists; switch with git checkout main (no -b, which creates one).",
            "Switch to the existing main branch.",
            fixes=("I didn't want a new branch, main already exists. Just switch to it.",
                   "Drop the -b, main exists.")),
    Mistake("Who painted 'The Starry Night'?",
            "'The Starry Night' was painted by Claude Monet.",
            "'The Starry Night' is by Vincent van Gogh (1889), not Monet.",
            "Which artist made The Starry Night?", "Vincent van Gogh", "Claude Monet"),
    Mistake("How many seconds are in an hour?", "There are 360 seconds in an hour.",
            "An hour has 60 × 60 = 3,600 seconds.",
            "An hour is how many seconds?", "3,600", "360"),
    Mistake("Summarise the article in three bullet points.",
            "The article discusses remote work, its benefits for productivity, the challenges "
            "it creates for team communication, and the new tools companies adopt.",
            "The user asked for exactly three bullet points; format the summary as a 3-item "
            "list.",
            "Give me the article's key points as a 3-item bulleted list.",
            fixes=("I asked for three bullet points, you wrote a paragraph.",
                   "Bullets please, three of them.")),
    Mistake("What's the freezing point of water in Fahrenheit?", "Water freezes at 0 °F.",
            "Water freezes at 32 °F (0 °C).",
            "At what Fahrenheit temperature does water freeze?", "32 °F", "0 °F"),
    Mistake("Add Jordan to the project channel.", "Added Jordan to #general.",
            "Add Jordan to the project channel, #project-atlas, not #general.",
            "Jordan should be in #project-atlas, please add them there.", "#project-atlas",
            "#general"),
)

TRAIN_LONGS = (
    Long("What does DNS do?",
         "DNS, the Domain Name System, is essentially the phone book of the internet. When you "
         "type a domain like example.com, your computer asks a resolver, which queries the root "
         "servers, then the top-level domain servers, then the authoritative server for that "
         "domain, to find its IP address. The answer is cached for as long as the record's TTL "
         "allows, so later lookups are faster. Without DNS you would need numeric addresses.",
         "prose"),
    Long("How do I read a file line by line in Python?",
         "There are several ways to read a file line by line in Python. The most common and "
         "memory-efficient approach is to open it with a context manager and iterate over the "
         "file object:\n\nwith open('data.txt') as f:\n    for line in f:\n        "
         "print(line.rstrip())\n\nThe with statement closes the file automatically, and the "
         "loop reads one line at a time instead of loading everything into memory.",
         "code"),
    Long("How many people live in Tokyo?",
         "Tokyo's population depends on how you define the city. The 23 special wards have "
         "about 9.7 million residents, Tokyo Metropolis as a whole has roughly 14 million, and "
         "the Greater Tokyo Area, which includes Kanagawa, Saitama and Chiba, is home to around "
         "37 million people, the most populous metropolitan area in the world. The figures "
         "shift a little each year.",
         "number"),
    Long("What's the difference between RAM and storage?",
         "RAM and storage both hold data, but they serve different purposes. RAM is fast, "
         "temporary memory that the processor uses for whatever is running right now; its "
         "contents vanish when the power goes off. Storage, such as an SSD or hard drive, is "
         "slower but permanent, keeping your files, apps and operating system between "
         "sessions. More RAM lets you run more at once; more storage lets you keep more.",
         "prose"),
    Long("How do I check free disk space on Linux?",
         "The standard tool for checking disk space on Linux is df, which reports usage for "
         "every mounted filesystem. Run df -h to get human-readable sizes such as G and M "
         "instead of raw blocks. The output lists each filesystem with its size, used space, "
         "available space, use percentage and mount point. To see which folders take the "
         "space, run du -sh * inside a directory, or try ncdu.",
         "code"),
    Long("Why is the sky blue?",
         "The sky looks blue because of Rayleigh scattering. Sunlight contains all visible "
         "colours, and in the atmosphere it meets nitrogen and oxygen molecules much smaller "
         "than its wavelength. These scatter short wavelengths, like blue and violet, far more "
         "strongly than long ones like red. Our eyes are more sensitive to blue than violet, "
         "so the scattered light reaching us from every direction looks blue.",
         "prose"),
    Long("Should I use tabs or spaces in Python?",
         "This is a long-running debate, but for Python it is fairly settled. PEP 8, the "
         "official style guide, recommends four spaces per indentation level, and most of the "
         "ecosystem follows it, including formatters like Black and Ruff. Python 3 also "
         "refuses code that mixes tabs and spaces inconsistently. Tabs are allowed, but spaces "
         "keep your code consistent with libraries and colleagues.",
         "prose"),
    Long("How far is the Moon from Earth?",
         "The Moon's distance from Earth is not fixed, because its orbit is an ellipse. At its "
         "closest point, perigee, it is about 363,000 kilometres away, and at its farthest, "
         "apogee, about 405,000 kilometres. The average usually quoted is roughly 384,400 "
         "kilometres, or about 238,900 miles. Light covers that in a little over one second; "
         "the Apollo crews took about three days.",
         "number"),
    Long("How do I reverse an array in JavaScript?",
         "JavaScript arrays have a built-in reverse() method, but be careful: it reverses the "
         "array in place and returns the same array, so the original changes. To keep the "
         "original intact, copy it first with the spread operator, as in [...arr].reverse(), "
         "or use the newer toReversed() method in modern browsers and Node 20. For strings, "
         "split into characters, reverse, then join.",
         "code"),
    Long("What is a REST API?",
         "A REST API is a way for programs to talk over HTTP following conventions called "
         "Representational State Transfer. Resources, such as users or orders, are identified "
         "by URLs, and you act on them with standard methods: GET to read, POST to create, PUT "
         "or PATCH to update and DELETE to remove. Responses are usually JSON, and each request "
         "is stateless, carrying everything the server needs.",
         "prose"),
    Long("Give me a tip for better sleep.",
         "Many factors influence sleep quality, so it helps to look at your routine as a "
         "whole. One of the most effective habits is a consistent schedule, going to bed and "
         "waking up at the same time every day, even at weekends, which anchors your body "
         "clock. It also helps to avoid screens for an hour before bed, keep the bedroom cool "
         "and dark, and cut caffeine after early afternoon.",
         "prose"),
    Long("How long does sunlight take to reach Earth?",
         "Sunlight travels at about 299,792 kilometres per second, and the average distance "
         "between the Sun and Earth is about 149.6 million kilometres. Dividing one by the "
         "other gives roughly 499 seconds, about 8 minutes and 20 seconds. Because Earth's "
         "orbit is slightly elliptical, the time varies through the year, from about 8 "
         "minutes 10 seconds in January to 8 minutes 27 seconds in July.",
         "number"),
    Long("How do I create a virtual environment in Python?",
         "Python ships with the venv module, so you don't need to install anything extra. In "
         "your project folder, run python -m venv .venv to create an environment in a folder "
         "called .venv. Then activate it: source .venv/bin/activate on macOS and Linux, or "
         ".venv\\Scripts\\activate on Windows. Once active, pip installs packages into that "
         "environment only. Run deactivate when you're done.",
         "code"),
    Long("What is inflation?",
         "Inflation is the general rise in prices across an economy over time, which means "
         "each unit of money buys fewer goods and services than before. It is usually "
         "measured with a consumer price index that tracks the cost of a typical basket of "
         "goods. Moderate inflation, around two percent a year, is considered healthy by most "
         "central banks, while high inflation erodes savings and wages.",
         "prose"),
    Long("Compare SQL and NoSQL databases.",
         "SQL databases, like PostgreSQL and MySQL, store data in tables with a fixed schema "
         "and are queried with SQL, which makes them strong for complex joins and strict "
         "transactions. NoSQL databases, such as MongoDB, Redis or Cassandra, use flexible "
         "models like documents, key-value pairs or wide columns. They often scale out more "
         "easily and suit fast-changing data, but may trade consistency or query power.",
         "prose"),
    Long("How do I kill a process by name on Linux?",
         "There are a couple of ways to do this. The simplest is pkill, which matches "
         "processes by name: pkill firefox sends the TERM signal to every process whose name "
         "matches. If a process refuses to exit, add -9 to send KILL instead, though that "
         "skips cleanup. Alternatively, find the PID with pgrep firefox and run kill with "
         "that PID. killall works similarly on most distributions.",
         "code"),
    Long("At what temperature does water boil on top of Everest?",
         "Water boils at a lower temperature at high altitude because the air pressure is "
         "lower. At sea level the boiling point is 100 °C, but on the summit of Everest, at "
         "8,849 metres, the pressure is only about a third of sea-level pressure. As a result, "
         "water boils at roughly 70 °C there, which is why climbers struggle to cook food "
         "properly and why pressure cookers are popular at altitude.",
         "number"),
    Long("What is a git rebase?",
         "A rebase replays a series of commits onto a new base commit. Suppose you branched "
         "off main and main has since moved forward; git rebase main takes your branch's "
         "commits and reapplies them one by one on top of the latest main. The result is a "
         "linear history without merge commits, which many teams find easier to read. It "
         "rewrites commit hashes, so avoid rebasing shared branches.",
         "prose"),
)

TRAIN_FORMS = (
    Form("too long, give me one sentence",
         "The user wants a one-sentence answer; keep it to one sentence.",
         kinds("prose", "number")),
    Form("Way too much text. Just the answer please.",
         "Give only the bare answer, without the explanation around it.", kinds("number")),
    Form("Can you make that a bulleted list?",
         "Format the answer as a short bulleted list, not as prose.", kinds("prose")),
    Form("tl;dr?", "Give a very short summary, a line or two at most.", ALL),
    Form("Shorter please, under 20 words.", "Keep the whole answer under 20 words.",
         kinds("prose", "number")),
    Form("I just need the command, not the explanation.",
         "Reply with the command only, with no explanation.", kinds("code")),
    Form("Too wordy. Two sentences max.", "Answer in at most two sentences.",
         kinds("prose", "number")),
    Form("Could you cut that down to a single line?", "Fit the whole answer on a single line.",
         kinds("code", "number")),
    Form("That's a wall of text; just give me the number.",
         "Reply with the number only, no surrounding text.", kinds("number")),
    Form("Simpler please, like I'm ten.",
         "Explain it briefly, in plain words a ten-year-old could follow.", kinds("prose")),
    Form("Less detail, more to the point.",
         "Be brief and direct; skip the background and the side notes.", ALL),
    Form("Just the code, no commentary.", "Reply with the code alone, with no commentary.",
         kinds("code")),
)

TRAIN_THANKS = (
    "perfect, thanks", "That works, thank you!", "great, exactly what I needed",
    "Thanks a lot!", "Nice, that did it.", "Awesome, cheers.", "Perfect.",
    "That's exactly it, thanks.", "works like a charm", "Brilliant, thank you so much.",
    "thx!", "ty, that's right", "Yep, that's correct.", "Confirmed, it works now.",
    "Looks good to me, thanks.", "Spot on.", "Great answer, thanks!",
    "That's what I was looking for.", "Much appreciated!", "Cool, that's perfect.",
    "Excellent, thank you.", "Yes! That fixed it.", "Thank you, very helpful.", "Nailed it.",
    "Just tried it and it works.", "Good stuff, thanks.", "Right, that's correct. Thanks!",
    "Lovely, cheers!", "Super, that's all I needed.", "Exactly right, thank you.",
    "Many thanks!", "That's great, appreciate it.", "Works for me.", "Tested it, all good.",
    "Okay perfect, thank you!", "ok great, that's it", "Fantastic, thanks!",
    "Yes, that's the one.", "Thanks, that clears it up.", "That helps a lot, thank you.",
    "Sweet, thanks!", "You're a lifesaver, thanks.", "Yup, that works perfectly.",
    "Ah, that makes sense now. Thanks!", "Bang on, cheers.", "Correct, cheers.",
)

TRAIN_MOVE_ON = (
    "ok now can you also {f}?", "Next, {f}.", "Great, now {f}.", "Now {f}.",
    "Thanks. Next up: {f}.", "Good. Can you {f} as well?", "Perfect, let's move on: {f}.",
    "Alright, now please {f}.", "Cool. Another thing: {f}.", "Got it. Could you {f} next?",
    "That's fine. Now {f}, please.", "Okay, next task: {f}.", "Makes sense. Can you also {f}?",
    "Nice. Then {f}.",
)

TRAIN_CORRECTIONS = (
    "No, it's {right}, not {wrong}.", "It's {right}.", "Actually, it should be {right}.",
    "Thanks, but that's {wrong}. I need {right}.", "{Right}, not {wrong}.",
    "That's incorrect: {right}.", "Not quite. {Right}.", "wrong one. {Right}",
    "Hmm, I'm pretty sure it's {right}.", "You gave {wrong}; the right one is {right}.",
    "Should be {right}.", "thanks but it's {right} actually",
    "No no, {right}.", "Wrong, it's {right}.", "{Right} is the right one.", "Hm, no: {right}.",
    "Great, but it's actually {right}, not {wrong}.", "Mistake there: {right}, not {wrong}.",
    "That's {wrong}, I need {right}.", "The answer is {right}.", "Not {wrong}. {Right}.",
    "ok but that's wrong, {right}", "Right idea, wrong answer: it's {right}.",
    "Incorrect. It is {right}.",
)

TRAIN_REDO = (
    "try again", "That's not what I asked.", "Please redo that.", "No, redo it.",
    "This isn't it, have another go.", "That doesn't answer my question.", "Nope. Start over.",
    "You misunderstood, try once more.", "That's off. Do it again, properly.",
    "Not what I wanted, please try again.",
    "One more time please.", "Wrong, try it again.", "Give it another try.",
    "Nope, that's not it. Again.", "Please try that again from scratch.", "Not right, retry.",
    "Can you do that over?", "That missed the point, redo it.",
)

TRAIN_VAGUE = (
    "hmm", "ok", "I'll think about it", "maybe", "ok...", "Interesting.",
    "let me get back to you", "not sure", "ok I guess", "?", "hmm ok", "I see.", "brb",
    "ok, I'll have a look later", "whatever", "Hm, I need to check with my manager first.",
    "lol", "Not sure what to make of that.", "I'll decide tomorrow.", "Let me sleep on it.",
    "uh", "ok so", "Can't tell yet.", "We'll see.", "Give me a minute.", "ok, anyway", "Huh.",
    "oh", "ok hold on", "mhm", "k", "ok, I'll ask Sam what he thinks", "possibly",
    "Okay. Let me check something first.",
    "gimme a sec", "back in 5", "will see", "hmm, not sure about that", "okay then",
    "I'll mull it over.",
)

TRAIN_UNRELATED = (
    "Hmm, what about the weather tomorrow?", "Wait, is it going to rain on Saturday?",
    "Did you watch the match last night?", "What time does the pharmacy close today?",
    "Random thought: should I get a cat?", "Hmm, is it lunch time already?",
    "Hm, my coffee went cold.", "By the way, my neighbour is drilling again.",
    "Do you like jazz?", "I'm in a meeting, talk later.", "Where did I leave my keys...",
    "My train is delayed again.",
    "Off topic, but what's a good pizza place?", "My phone battery is almost dead.",
    "Ugh, Mondays.", "Is it Friday yet?", "I need to walk the dog in a bit.",
    "Do you know any good podcasts?", "Sorry, my boss just walked in.",
    "Random: what's your favourite colour?",
)

TRAIN_TOOLS = (
    ToolKind(
        (
            A("Run the unit tests for the billing module.", "Running the billing tests.",
              "run_command", sh("pytest tests/billing -q"), target="tests/billing"),
            A("Run the whole test suite before I merge.", "Starting the full test run.",
              "run_command", sh("pytest -q"), target="tests"),
            A("Check that the parser tests still pass after my change.",
              "Let me run the parser tests.", "run_command",
              sh("pytest tests/test_parser.py -q"), target="tests/test_parser.py"),
        ),
        {
            1: ("{dots} [100%]\n{n} passed in {sec}s",
                "{n} passed, {k} skipped in {sec}s",
                "============ test session starts ============\ncollected {n} items\n\n"
                "{target} {dots} [100%]\n\n============ {n} passed in {sec}s ============"),
            -1: ("ImportError while importing test module '{target}'.\n"
                 "E   ModuleNotFoundError: No module named '{pymod}'\n"
                 "!!! Interrupted: 1 error during collection !!!",
                 "bash: pytest: command not found",
                 "ERROR: file or directory not found: {target}\n\nno tests ran in {sec}s"),
            0: ("collected 0 items\n\nno tests ran in {sec}s",
                "{target} {dots}\n[output truncated]"),
        },
    ),
    ToolKind(
        (
            A("Run the Rust unit tests.", "Running cargo test.", "run_command", sh("cargo test"),
              ok=("running {n} tests\n{dots}\ntest result: ok. {n} passed; 0 failed; 0 ignored; "
                  "0 measured; 0 filtered out; finished in {sec}s",),
              err=("error: could not find `Cargo.toml` in `/home/dev` or any parent directory",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Show me what's in config.yaml.", "Reading config.yaml.", "read_file",
              {"path": "config.yaml"}, path="config.yaml",
              content="server:\n  host: 0.0.0.0\n  port: 8080\nlog_level: info\nworkers: 4"),
            A("Open the README so I can see the install steps.", "Opening README.md.",
              "read_file", {"path": "README.md"}, path="README.md",
              content="# inventory-api\n\n## Install\n\npip install -e .\n\n## Run\n\nmake serve"),
            A("Read src/utils.py and tell me what it exports.", "Reading src/utils.py first.",
              "read_file", {"path": "src/utils.py"}, path="src/utils.py",
              content="__all__ = [\"slugify\", \"chunked\"]\n\n\ndef slugify(text: str) -> str:"
                      "\n    return \"-\".join(text.lower().split())\n\n\ndef chunked(xs, n):\n"
                      "    return [xs[i:i + n] for i in range(0, len(xs), n)]"),
            A("Check what's in .env.example.", "Let me read .env.example.", "read_file",
              {"path": ".env.example"}, path=".env.example",
              content="DATABASE_URL=postgres://localhost:5432/app\n"
                      "REDIS_URL=redis://localhost:6379/0\nSECRET_KEY=change-me"),
            A("Which versions does requirements.txt pin?", "Reading requirements.txt.",
              "read_file", {"path": "requirements.txt"}, path="requirements.txt",
              content="flask==3.0.3\nrequests==2.32.3\nsqlalchemy==2.0.31\ngunicorn==22.0.0"),
        ),
        {
            1: ("@content", "@content_json"),
            -1: ("FileNotFoundError: [Errno 2] No such file or directory: '{path}'",
                 "PermissionError: [Errno 13] Permission denied: '{path}'",
                 "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x{hexb} in position {n}: "
                 "invalid start byte"),
            0: ("(file is empty)",),
        },
    ),
    ToolKind(
        (
            A("List the files in src/.", "Listing src/.", "list_dir", {"path": "src"},
              path="src"),
            A("What's inside the logs folder?", "Checking the logs folder.", "run_command",
              sh("ls -la logs/"), path="logs"),
            A("Show me what's in the migrations directory.", "Listing db/migrations.",
              "list_dir", {"path": "db/migrations"}, path="db/migrations"),
        ),
        {
            1: ("@listing", "@listing_long"),
            -1: ("ls: cannot access '{path}': No such file or directory",
                 "ls: cannot open directory '{path}': Permission denied",
                 "{{\"error\": \"ENOENT\", \"path\": \"{path}\"}}"),
            0: ("total 0",),
        },
    ),
    ToolKind(
        (
            A("Fetch user 42 from the API.", "Calling GET /api/users/42.", "http_request",
              {"method": "GET", "url": "https://api.example.com/api/users/42"},
              host="api.example.com",
              ok=("HTTP 200 OK\n{{\"id\": 42, \"name\": \"{person}\", \"email\": \"{email}\", "
                  "\"active\": true}}",),
              vague=("HTTP 200 OK\n{{}}",)),
            A("Create an order for 3 widgets.", "Sending the order request.", "http_request",
              {"method": "POST", "url": "https://api.example.com/api/orders",
               "body": {"item": "widget", "qty": 3}}, host="api.example.com",
              err=("HTTP 422 Unprocessable Entity\n{{\"detail\": [{{\"loc\": [\"body\", "
                   "\"{field}\"], \"msg\": \"field required\"}}]}}",),
              ok=("HTTP 201 Created\n{{\"order_id\": {n}, \"item\": \"widget\", \"qty\": 3, "
                  "\"status\": \"pending\"}}",
                  "HTTP 201 Created\nLocation: /api/orders/{n}"),
              vague=("HTTP 202 Accepted\n{{\"status\": \"queued\", \"job\": \"{hexid}\"}}",)),
            A("Delete session abc123.", "Deleting the session.", "http_request",
              {"method": "DELETE", "url": "https://api.example.com/api/sessions/abc123"},
              host="api.example.com",
              ok=("HTTP 204 No Content",)),
            A("Update my notification settings to email only.", "Updating the settings.",
              "http_request",
              {"method": "PUT", "url": "https://api.example.com/api/settings",
               "body": {"notify": "email"}}, host="api.example.com",
              err=("HTTP 422 Unprocessable Entity\n{{\"detail\": [{{\"loc\": [\"body\", "
                   "\"{field}\"], \"msg\": \"field required\"}}]}}",),
              ok=("HTTP 200 OK\n{{\"notify\": \"email\", \"updated_at\": "
                  "\"2024-{mm}-{dd}T10:{mi}:00Z\"}}",),
              vague=("HTTP 202 Accepted",)),
            A("Check whether the payments service is healthy.", "Hitting its health endpoint.",
              "http_request", {"method": "GET", "url": "https://payments.internal/healthz"},
              host="payments.internal",
              ok=("HTTP 200 OK\n{{\"status\": \"ok\", \"uptime_s\": {n}{k}{k}}}",)),
        ),
        {
            -1: ("HTTP 404 Not Found\n{{\"error\": \"not_found\", \"detail\": \"No such "
                 "resource\"}}",
                 "HTTP 500 Internal Server Error\n<html><body><h1>Internal Server Error</h1>"
                 "</body></html>",
                 "HTTP 401 Unauthorized\n{{\"error\": \"invalid_token\", \"error_description\": "
                 "\"The access token expired\"}}",
                 "requests.exceptions.ReadTimeout: HTTPSConnectionPool(host='{host}', "
                 "port=443): Read timed out. (read timeout=30)",
                 "HTTP 503 Service Unavailable\nRetry-After: 30"),
        },
    ),
    ToolKind(
        (
            A("Mark every order from before 2023 as archived.", "Running the update.",
              "run_sql",
              {"query": "UPDATE orders SET archived = true WHERE created_at < '2023-01-01';"},
              table="orders", ok=("UPDATE {n}", "{n} rows affected"), vague=("UPDATE 0",)),
            A("Add a new customer named Dana Ortiz.", "Inserting the customer row.", "run_sql",
              {"query": "INSERT INTO customers (name) VALUES ('Dana Ortiz');"},
              table="customers", ok=("INSERT 0 1", "1 row affected")),
            A("How many active users do we have?", "Counting the active users.", "run_sql",
              {"query": "SELECT count(*) FROM users WHERE active;"}, table="users",
              ok=(" count\n-------\n {n}{k}\n(1 row)",)),
            A("Delete the test accounts from the users table.",
              "Deleting users whose email ends in @test.local.", "run_sql",
              {"query": "DELETE FROM users WHERE email LIKE '%@test.local';"}, table="users",
              ok=("DELETE {n}",), vague=("DELETE 0",)),
            A("List the five newest products.", "Querying products by creation date.",
              "run_sql",
              {"query": "SELECT id, name FROM products ORDER BY created_at DESC LIMIT 5;"},
              table="products", ok=("@psql_products",)),
        ),
        {
            -1: ("ERROR:  syntax error at or near \"{sqltok}\"\nLINE 1: {sqltok} ...",
                 "ERROR:  relation \"{table}\" does not exist",
                 "ERROR:  permission denied for table {table}",
                 "ERROR:  canceling statement due to statement timeout",
                 "psycopg2.OperationalError: could not connect to server: Connection refused\n"
                 "\tIs the server running on host \"localhost\" and accepting TCP/IP "
                 "connections on port 5432?"),
        },
    ),
    ToolKind(
        (
            A("Push my branch to origin.", "Pushing feature/search to origin.", "run_command",
              sh("git push origin feature/search"),
              ok=("To github.com:acme/shop.git\n   {sha}..{sha2}  feature/search -> "
                  "feature/search",),
              err=("To github.com:acme/shop.git\n ! [rejected]        feature/search -> "
                   "feature/search (non-fast-forward)\nerror: failed to push some refs to "
                   "'github.com:acme/shop.git'",
                   "fatal: Authentication failed for 'https://github.com/acme/shop.git/'")),
            A("Pull the latest changes from main.", "Pulling main.", "run_command",
              sh("git pull origin main"),
              ok=("Updating {sha}..{sha2}\nFast-forward\n src/app.py | {k} ++++--\n 1 file "
                  "changed, 4 insertions(+), 2 deletions(-)",
                  "Already up to date."),
              err=("Auto-merging src/app.py\nCONFLICT (content): Merge conflict in src/app.py\n"
                   "Automatic merge failed; fix conflicts and then commit the result.",)),
            A("Commit the staged changes with the message 'fix login redirect'.",
              "Committing the staged changes.", "run_command",
              sh("git commit -m 'fix login redirect'"),
              ok=("[main {sha}] fix login redirect\n 2 files changed, {n} insertions(+), {k} "
                  "deletions(-)",),
              err=("fatal: not a git repository (or any of the parent directories): .git",),
              vague=("On branch main\nnothing added to commit but untracked files present "
                     "(use \"git add\" to track)",)),
            A("Show me the last three commits.", "Running git log.", "run_command",
              sh("git log --oneline -3"), ok=("@gitlog",),
              err=("fatal: your current branch 'main' does not have any commits yet",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Compile main.c.", "Compiling with gcc.", "run_command",
              sh("gcc -Wall -o main main.c"),
              err=("main.c:{line}:{col}: error: expected ';' before '}}' token",
                   "main.c: In function 'main':\nmain.c:{line}:{col}: error: 'count' "
                   "undeclared (first use in this function)",
                   "/usr/bin/ld: /tmp/cc{hexid}.o: in function `main':\nmain.c:(.text+0x1e): "
                   "undefined reference to `sqrt'\ncollect2: error: ld returned 1 exit status"),
              vague=("main.c:{line}:{col}: warning: unused variable 'tmp' "
                     "[-Wunused-variable]",)),
            A("Type-check the frontend.", "Running tsc --noEmit.", "run_command",
              sh("npx tsc --noEmit"),
              err=("src/{tsfile}.ts({line},{col}): error TS2322: Type 'string' is not "
                   "assignable to type 'number'.",
                   "src/{tsfile}.ts({line},{col}): error TS2304: Cannot find name 'process'.\n\n"
                   "Found 1 error in src/{tsfile}.ts:{line}")),
        ),
        {1: ("", "Exit code: 0")},
    ),
    ToolKind(
        (
            A("Install pandas.", "Installing pandas with pip.", "run_command",
              sh("pip install pandas"), pkg="pandas", ver="2.2.2"),
            A("Add httpx to the environment.", "Installing httpx.", "run_command",
              sh("pip install httpx"), pkg="httpx", ver="0.27.0"),
            A("Install numpy 1.26.4 exactly.", "Installing numpy==1.26.4.", "run_command",
              sh("pip install numpy==1.26.4"), pkg="numpy", ver="1.26.4"),
        ),
        {
            1: ("Collecting {pkg}\n  Downloading {pkg}-{ver}-py3-none-any.whl ({kb} kB)\n"
                "Installing collected packages: {pkg}\nSuccessfully installed {pkg}-{ver}",
                "Requirement already satisfied: {pkg} in ./.venv/lib/python3.11/site-packages "
                "({ver})"),
            -1: ("ERROR: Could not find a version that satisfies the requirement {pkg} (from "
                 "versions: none)\nERROR: No matching distribution found for {pkg}",
                 "error: externally-managed-environment\n\n× This environment is externally "
                 "managed",
                 "ERROR: Could not install packages due to an OSError: [Errno 13] Permission "
                 "denied: '/usr/lib/python3/dist-packages/{pkg}'"),
        },
    ),
    ToolKind(
        (
            A("Create a backups directory in /srv.", "Creating /srv/backups.", "run_command",
              sh("mkdir -p /srv/backups"), ok=("", "Exit code: 0"),
              err=("mkdir: cannot create directory '/srv/backups': Permission denied",)),
            A("Copy the site config to /etc/nginx/sites-available.", "Copying site.conf.",
              "run_command", sh("cp site.conf /etc/nginx/sites-available/"), ok=("",),
              err=("cp: cannot stat 'site.conf': No such file or directory",)),
            A("Restart the redis service.", "Restarting redis.", "run_command",
              sh("sudo systemctl restart redis"), ok=("", "Exit code: 0"),
              err=("Job for redis.service failed because the control process exited with "
                   "error code.\nSee \"systemctl status redis.service\" for details.",
                   "Failed to restart redis.service: Unit redis.service not found.")),
            A("Make deploy.sh executable.", "Running chmod +x on deploy.sh.", "run_command",
              sh("chmod +x deploy.sh"), ok=("",),
              err=("chmod: cannot access 'deploy.sh': No such file or directory",)),
            A("Check the server's uptime.", "Running uptime.", "run_command", sh("uptime"),
              ok=(" 14:{mi}:07 up {n} days,  3:{mi},  2 users,  load average: 0.{k}1, 0.31, "
                  "0.28",),
              err=("bash: uptime: command not found",)),
            A("Run the database backup script.", "Running ./backup.sh.", "run_command",
              sh("./backup.sh"),
              ok=("Backup written to /srv/backups/db-2024{mm}{dd}.sql.gz ({n} MB)",),
              err=("Command timed out after 300 seconds",
                   "Exit code: 1\npg_dump: error: connection to server on socket "
                   "\"/var/run/postgresql/.s.PGSQL.5432\" failed: No such file or directory"),
              vague=("Starting backup...",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Compute the mean of the value column in data.csv.", "Running a quick pandas "
              "script.", "run_python",
              {"code": "import pandas as pd\nprint(pd.read_csv('data.csv')['value'].mean())"},
              ok=("{n}.{k}{k}",),
              err=("Traceback (most recent call last):\n  File \"<stdin>\", line 2, in "
                   "<module>\nKeyError: 'value'",
                   "Traceback (most recent call last):\n  File \"<stdin>\", line 2, in "
                   "<module>\nFileNotFoundError: [Errno 2] No such file or directory: "
                   "'data.csv'")),
            A("Load config.json and print the server port.", "Reading the port with Python.",
              "run_python",
              {"code": "import json\ncfg = json.load(open('config.json'))\n"
                       "print(cfg['server']['port'])"},
              ok=("8080",),
              err=("Traceback (most recent call last):\n  File \"<stdin>\", line 3, in "
                   "<module>\nTypeError: string indices must be integers, not 'str'",
                   "Traceback (most recent call last):\n  File \"<stdin>\", line 2, in "
                   "<module>\njson.decoder.JSONDecodeError: Expecting value: line 1 column 1 "
                   "(char 0)")),
            A("Count the words in notes.txt with Python.", "Counting words in notes.txt.",
              "run_python", {"code": "print(len(open('notes.txt').read().split()))"},
              ok=("{n}{k}",),
              err=("Traceback (most recent call last):\n  File \"<stdin>\", line 1, in "
                   "<module>\nAttributeError: 'NoneType' object has no attribute 'split'",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Search for the latest Python release.", "Searching the web.", "web_search",
              {"query": "latest Python release"},
              ok=("{{\"results\": [{{\"title\": \"Python Release Python 3.12.4\", \"url\": "
                  "\"https://www.python.org/downloads/release/python-3124/\"}}, {{\"title\": "
                  "\"What's New In Python 3.12\", \"url\": "
                  "\"https://docs.python.org/3/whatsnew/3.12.html\"}}]}}",)),
            A("Find the opening hours of the city library.", "Searching for the hours.",
              "web_search", {"query": "city library opening hours"},
              ok=("{{\"results\": [{{\"title\": \"Central Library: Hours\", \"snippet\": "
                  "\"Mon–Fri 9:00–20:00, Sat 10:00–16:00\"}}]}}",)),
        ),
        {
            -1: ("Error: search backend returned HTTP 429 Too Many Requests",),
            0: ("{{\"results\": []}}",
                "Partial results: 2 of 5 sources timed out.\n1. Untitled page (no snippet)"),
        },
    ),
)

TRAIN_FILL = {
    "pymod": ("freezegun", "responses", "hypothesis", "factory_boy"),
    "person": ("Felix Brandt", "Maya Chen", "Tom Okafor", "Lena Varga"),
    "tsfile": ("api", "store", "router", "format"),
    "field": ("email", "quantity", "currency"),
    "sqltok": ("FORM", "WHER", "SELEC"),
    "files": ("main.py", "app.py", "models.py", "views.py", "config.py", "__init__.py",
              "cli.py", "db.py", "0001_initial.sql", "0002_add_index.sql", "server.log",
              "worker.log", "access.log"),
    "commits": ("fix null check in parser", "add retry to upload", "bump version to 2.3.1",
                "refactor auth middleware", "update README badges", "remove dead code"),
    "products": ("Desk Lamp", "Walnut Shelf", "Linen Throw", "Steel Bottle", "Oak Stool",
                 "Wool Rug", "Glass Vase"),
}


# The held-out split's pools: no entry of any pool appears in the train split's.

HELDOUT_GOOD = (
    G("Write a Go function that sums a slice of ints.",
      "func Sum(xs []int) int {\n\ttotal := 0\n\tfor _, x := range xs {\n\t\ttotal += x\n\t}\n"
      "\treturn total\n}",
      "write a table-driven test for it", "make it generic over number types"),
    G("How do I list the installed Python packages?",
      "pip list shows them all; pip freeze prints them in requirements format.",
      "show how to upgrade one of them", "save them to a file"),
    G("Write a Rust function that checks whether a number is even.",
      "fn is_even(n: i64) -> bool {\n    n % 2 == 0\n}",
      "add a doc comment", "write a test module for it"),
    G("Which command shows the last 50 lines of app.log and keeps following it?",
      "tail -n 50 -f app.log",
      "filter it to lines containing ERROR", "do the same with journalctl for a service"),
    G("How do I rename a column in pandas?",
      "df = df.rename(columns={'old_name': 'new_name'})",
      "rename several columns at once", "make every column name lowercase"),
    G("Compute the range of 14, 3, 22, 9.",
      "The range is 22 − 3 = 19.",
      "find the mean as well", "compute the variance"),
    G("Write a thank-you note to a colleague who covered my shift.",
      "Hi Sam, thank you so much for covering my shift on Saturday. I really appreciate it "
      "and owe you one!",
      "make it sound more formal", "write a shorter text-message version"),
    G("Who painted the Mona Lisa?",
      "Leonardo da Vinci, in the early 1500s.",
      "tell me where it hangs", "name another of his paintings"),
    G("What is the freezing point of water in kelvin?",
      "273.15 K.",
      "convert absolute zero to Celsius", "explain why the kelvin scale has no negatives"),
    G("Move my 1:1 with Omar from Thursday to Friday, same time.",
      "Moved: '1:1 with Omar' is now Friday 11:00–11:30, and Omar has been notified.",
      "attach the agenda doc to the invite", "make it repeat every two weeks"),
    G("What is 7 factorial?",
      "7! = 5040.",
      "work out 10 factorial", "write a function that computes it"),
    G("Simplify the fraction 42/56.",
      "42/56 = 3/4 (divide both by 14).",
      "simplify 18/24", "turn it into a decimal"),
    G("Write a GitHub Actions step that runs npm test.",
      "- name: Run tests\n  run: npm test",
      "add a step that caches node_modules", "run it on Node 18 and 20"),
    G("What's the difference between TCP and UDP, briefly?",
      "TCP is connection-based and guarantees ordered, reliable delivery. UDP sends "
      "datagrams with no delivery guarantee, trading reliability for lower latency.",
      "tell me which one DNS uses", "give an example app for each"),
    G("Suggest a title for a blog post about remote-work burnout.",
      "Logged On, Burnt Out: Staying Well When Home Is the Office",
      "write an intro paragraph", "give me two punchier titles"),
    G("Translate 'where is the train station' into Spanish.",
      "¿Dónde está la estación de tren?",
      "show how to ask for a ticket", "say it in Portuguese"),
    G("How many minutes are there in a week?",
      "7 × 24 × 60 = 10,080 minutes.",
      "give it in seconds", "work out the minutes in a 30-day month"),
    G("Write a bash loop that prints the numbers 1 to 5.",
      "for i in {1..5}; do echo \"$i\"; done",
      "make it count down instead", "write it as a while loop"),
    G("How do I check which Node.js version is installed?",
      "Run node --version (or node -v).",
      "show how to switch versions with nvm", "check the npm version too"),
    G("Book a meeting room for six people on Monday at 2pm.",
      "Booked Room Cedar (seats 8) for Monday 14:00–15:00.",
      "request a projector for it", "invite the design team"),
    G("What is the square root of 144?",
      "12.",
      "find the cube root of 27", "explain how to estimate square roots"),
    G("In SQL, how do I get the 10 most recent orders?",
      "SELECT * FROM orders\nORDER BY created_at DESC\nLIMIT 10;",
      "include the customer name with a join", "get the 10 oldest instead"),
    G("Name the longest river in South America.",
      "The Amazon.",
      "list the countries it flows through", "tell me how long it is"),
    G("Write a Makefile target that runs the linter.",
      "lint:\n\truff check .\n\n.PHONY: lint",
      "add a format target", "make the default target run both"),
)

HELDOUT_MISTAKES = (
    Mistake("What's the capital of Turkey?", "The capital of Turkey is Istanbul.",
            "Turkey's capital is Ankara; Istanbul is its largest city. Answer Ankara.",
            "Which city is the Turkish capital?", "Ankara", "Istanbul"),
    Mistake("How many sides does a hexagon have?", "A hexagon has eight sides.",
            "A hexagon has six sides; eight is an octagon.",
            "What's the side count of a hexagon?", "six", "eight"),
    Mistake("Stop the staging container.", "Stopped the production container api-prod.",
            "Stop only the staging container, api-staging; never touch production when staging "
            "was asked for.",
            "Please halt api-staging, the staging container.",
            fixes=("Staging, not prod! Stop api-staging.",
                   "You stopped production; I asked for the staging one.")),
    Mistake("Who discovered penicillin?", "Penicillin was discovered by Louis Pasteur.",
            "Alexander Fleming discovered penicillin, in 1928; answer Fleming.",
            "Which scientist first found penicillin, in 1928?", "Alexander Fleming",
            "Louis Pasteur"),
    Mistake("What is 9 × 8?", "9 × 8 = 81.",
            "9 × 8 = 72; 81 is 9 × 9.", "Multiply nine and eight.", "72", "81"),
    Mistake("Write a Python expression that checks whether n is odd.", "n % 2 == 0",
            "n is odd when n % 2 != 0; n % 2 == 0 tests for even.",
            "I need something that is true when n is an odd number.", "n % 2 != 0",
            "n % 2 == 0", ("That's the even check; odd is n % 2 == 1.",)),
    Mistake("How many players does a soccer team have on the field?",
            "Each soccer team has ten players on the field.",
            "A soccer team fields eleven players, goalkeeper included.",
            "How many players does one side put on the pitch in football?", "eleven", "ten"),
    Mistake("Set up the meeting with Lena for 3pm on Thursday.",
            "Meeting with Lena set for 3pm on Tuesday.",
            "The meeting with Lena is on Thursday at 3pm, not Tuesday.",
            "Lena's meeting goes on Thursday at 15:00.", "Thursday", "Tuesday"),
    Mistake("What's the speed of light, roughly?", "About 300,000 km per hour.",
            "Light travels about 300,000 km per second, not per hour.",
            "How fast does light travel, approximately?", "about 300,000 km per second",
            "per hour"),
    Mistake("Give the shell command that shows hidden files in a listing.", "ls -l",
            "Use ls -a (or ls -la) to list hidden dotfiles; -l alone does not show them.",
            "How do I make ls include dotfiles?", "ls -a", "ls -l"),
    Mistake("Who composed 'The Four Seasons'?", "'The Four Seasons' was composed by Mozart.",
            "'The Four Seasons' is by Antonio Vivaldi, not Mozart.",
            "Which composer wrote The Four Seasons concertos?", "Vivaldi", "Mozart"),
    Mistake("Attach the invoice PDF to the reply to Karim.",
            "Replied to Karim with the quote spreadsheet attached.",
            "Attach the invoice PDF in the reply to Karim, not the quote spreadsheet.",
            "Reply to Karim again with invoice.pdf attached.", "the invoice PDF",
            "the quote spreadsheet"),
    Mistake("What's the past tense of 'swim'?", "The past tense of 'swim' is 'swum'.",
            "The simple past of swim is 'swam'; 'swum' is the past participle.",
            "Yesterday I ___ in the lake: which form of swim goes there?", "swam", "swum"),
    Mistake("Convert 2 hours 15 minutes to minutes.", "2 hours 15 minutes is 125 minutes.",
            "2 h 15 min = 120 + 15 = 135 minutes.",
            "How many minutes make up 2h15?", "135", "125"),
    Mistake("Create a branch called hotfix from main.", "Created branch hotfix from develop.",
            "Create hotfix from main (git switch -c hotfix main), not from develop.",
            "Branch hotfix needs to start from main's latest commit.",
            fixes=("It should branch from main, not develop.",
                   "Base it on main please, develop has unreleased stuff.")),
)

HELDOUT_LONGS = (
    Long("What is photosynthesis?",
         "Photosynthesis is the process plants, algae and some bacteria use to turn light into "
         "chemical energy. Inside chloroplasts, the green pigment chlorophyll absorbs sunlight, "
         "and that energy splits water molecules and combines carbon dioxide from the air into "
         "glucose. Oxygen is released as a by-product, which is where most of the oxygen in "
         "our atmosphere comes from. The glucose fuels growth or is stored as starch.",
         "prose"),
    Long("How do I install a package with apt?",
         "On Debian and Ubuntu systems, apt is the package manager. Before installing "
         "anything, refresh the package lists so you get the latest versions by running sudo "
         "apt update. Then install the package with sudo apt install followed by its name, for "
         "example sudo apt install htop. Apt resolves dependencies automatically and asks you "
         "to confirm; add -y to skip the prompt.",
         "code"),
    Long("How tall is the Eiffel Tower?",
         "The Eiffel Tower's height has changed slightly over the years as antennas were added. "
         "When it was completed in 1889 it stood 312 metres tall, the tallest man-made "
         "structure in the world until 1930. Today, including its broadcast antennas, it "
         "reaches about 330 metres, roughly 1,083 feet. The top observation deck sits at "
         "around 276 metres, and heat can change the height by centimetres.",
         "number"),
    Long("What's a VPN for?",
         "A VPN, or virtual private network, creates an encrypted tunnel between your device "
         "and a server run by the VPN provider or your employer. All your traffic passes "
         "through it, so people on the same network, such as public Wi-Fi, can't read it, and "
         "websites see the VPN server's address instead of yours. Companies use VPNs for "
         "remote access; individuals use them for privacy.",
         "prose"),
    Long("How do I format a date as YYYY-MM-DD in Python?",
         "Python's datetime module makes this straightforward. If you have a date or datetime "
         "object, call its strftime method with a format string: d.strftime('%Y-%m-%d'), "
         "where %Y is the four-digit year, %m the zero-padded month and %d the zero-padded "
         "day. Since this format is ISO 8601, you can also call d.isoformat() on a date "
         "object, which avoids remembering the codes.",
         "code"),
    Long("How many calories are in a banana?",
         "The calorie count of a banana depends mostly on its size. A small banana of about "
         "100 grams has roughly 90 calories, a medium one of around 118 grams has about 105, "
         "and a large one can reach 120 or more. Most of those calories come from "
         "carbohydrates, including natural sugars and some fibre, with very little fat or "
         "protein. Riper bananas taste sweeter.",
         "number"),
    Long("What does a product manager do?",
         "A product manager is responsible for deciding what a team builds and why. They talk "
         "to customers, study data and market trends, and work with engineering, design and "
         "business stakeholders to define the problems worth solving. They then prioritise "
         "features, write requirements or user stories, and plan releases. They usually lead "
         "through influence rather than managing people directly.",
         "prose"),
    Long("How do I count the words in a file from the shell?",
         "The classic Unix tool for this is wc, short for word count. Running wc -w notes.txt "
         "prints the number of words followed by the filename. If you only want the number, "
         "redirect the file instead: wc -w < notes.txt. Without flags, wc prints lines, words "
         "and bytes together, and -l counts only lines. It also works in pipelines, such as "
         "cat *.txt | wc -w.",
         "code"),
)

HELDOUT_FORMS = (
    Form("Shorter. One line.", "Answer in a single line of text.", ALL),
    Form("Can I get that as numbered steps?",
         "Present it as short numbered steps instead of a paragraph.", kinds("code")),
    Form("Condense that to one sentence please.", "Reply with exactly one sentence.",
         kinds("prose", "number")),
    Form("Skip the essay, what's the figure?",
         "State the figure directly, with no essay around it.", kinds("number")),
    Form("Give me only the snippet.", "Reply with just the code or command, nothing else.",
         kinds("code")),
    Form("Make it about a third of the length.", "Cut the reply to about a third of its length.",
         ALL),
    Form("Bullet points, max three.", "Use no more than three bullet points.", kinds("prose")),
    Form("Too much reading, keep it brief.", "Keep it brief: two or three short lines at most.",
         ALL),
)

HELDOUT_THANKS = (
    "Thank you, that's perfect.", "great, that solved it", "Exactly what I wanted, thanks!",
    "Wonderful, thanks so much.", "that's correct, cheers", "Works great now.",
    "Appreciate it, that's right.", "Perfect answer.", "Thanks! Exactly right.",
    "Yes, that does it.", "All good, thank you!", "That's spot on, thanks.", "Brilliant.",
    "Great, that's working.", "Thanks so much, that's it.", "Yes, correct, thanks.",
    "Just what I needed!", "Awesome, it runs now.", "Nice one, thank you.",
    "Perfect, that's what I was after.", "ok, that works, thanks", "Cheers, that's correct.",
    "It worked first time, thanks!", "Excellent, exactly right.", "That's right, thanks a bunch.",
    "Great stuff!", "Thank you kindly.", "Love it, thanks.", "Yes, that's correct!",
    "Checked it, looks right.", "That did the trick.", "Superb, thank you.", "Thanks heaps!",
    "Perfect, that's the answer I needed.", "Good, that's exactly it.", "Legend, thanks.",
    "Works perfectly, thank you!", "Right on, that's it.", "Ta, that's great.", "Fab, thanks!",
    "Yes that fixed it, thanks.", "Verified, it's right.",
)

HELDOUT_MOVE_ON = (
    "Good, now {f}.", "ok, next: {f}.", "Thanks. Could you also {f}?", "Right. Now {f}.",
    "Great. Moving on, {f}.", "Sounds good. Please {f} too.", "Fine. Next, {f}.",
    "Lovely. Can you now {f}?",
)

HELDOUT_CORRECTIONS = (
    "Nope, {right}, not {wrong}.", "It should read {right}.", "Close, but it's {right}.",
    "Thanks, though that's {wrong}; it's {right}.", "That's not right. {Right}.",
    "I believe it's {right}, not {wrong}.", "Er, {right}.", "Correct answer: {right}.",
    "{Wrong}? No. {Right}.",
)

HELDOUT_REDO = (
    "Again, please.", "That isn't what I asked for.", "Redo this.", "Have another go at it.",
    "This doesn't answer what I asked.", "Nah, give it another shot.",
    "You've misread the request; once more.", "No good, start again.",
)

HELDOUT_VAGUE = (
    "mm", "okay", "I'll consider it.", "perhaps", "okay...", "Hm, interesting.",
    "I'll let you know.", "no idea", "ok, I suppose", "??", "ok hmm", "afk",
    "ok, will check later", "meh", "Need to ask my team first.", "haha", "Not sure yet.",
    "Let me think.", "ok well", "Hard to say.", "Hold on a sec.", "right...", "Could be.",
    "uhh", "Dunno.", "ok, later maybe",
)

HELDOUT_UNRELATED = (
    "Hmm. Any idea if it'll snow next week?", "By the way, who won the match in Madrid?",
    "Is the supermarket open on Sundays?", "My cat just knocked over a plant.",
    "Ugh, the wifi keeps dropping.", "Did you hear the thunder just now?",
    "Totally different thing: are you a morning person?", "Gotta pick up the kids soon.",
)

HELDOUT_TOOLS = (
    ToolKind(
        (
            A("Run the jest tests for the cart component.", "Running jest on the cart tests.",
              "run_command", sh("npx jest src/cart"),
              ok=("PASS src/cart/Cart.test.tsx\n  ✓ renders an empty cart ({ms} ms)\n  ✓ adds an "
                  "item ({ms2} ms)\n\nTests:       {n} passed, {n} total\nTime:        {sec} s",),
              err=("FAIL src/cart/Cart.test.tsx\n  ● Test suite failed to run\n\n    Cannot "
                   "find module './useCart' from 'src/cart/Cart.tsx'",),
              vague=("Determining test suites to run...\n[stream closed]",)),
            A("Run the Go tests in the store package.", "Running go test on ./store.",
              "run_command", sh("go test ./store/..."),
              ok=("ok  \tgithub.com/acme/shop/store\t{sec}s",),
              err=("# github.com/acme/shop/store\nstore/cache.go:{line}:{col}: undefined: lru\n"
                   "FAIL\tgithub.com/acme/shop/store [build failed]",),
              vague=("?   \tgithub.com/acme/shop/store\t[no test files]",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Show me the Makefile.", "Reading the Makefile.", "read_file",
              {"path": "Makefile"}, path="Makefile",
              content="test:\n\tpytest -q\n\nlint:\n\truff check .\n\n.PHONY: test lint"),
            A("Open docker-compose.yml.", "Opening docker-compose.yml.", "read_file",
              {"path": "docker-compose.yml"}, path="docker-compose.yml",
              content="services:\n  web:\n    build: .\n    ports:\n      - \"8000:8000\"\n  "
                      "db:\n    image: postgres:16"),
            A("Read package.json and tell me the start script.", "Reading package.json.",
              "read_file", {"path": "package.json"}, path="package.json",
              content="{\n  \"name\": \"dashboard\",\n  \"scripts\": {\n    \"start\": "
                      "\"vite\",\n    \"build\": \"vite build\"\n  }\n}"),
        ),
        {
            1: ("@content", "@content_numbered"),
            -1: ("cat: {path}: No such file or directory",
                 "Error: EACCES: permission denied, open '{path}'",
                 "IsADirectoryError: [Errno 21] Is a directory: '{path}'"),
            0: ("@content_cut",),
        },
    ),
    ToolKind(
        (
            A("List every Markdown file under docs/.", "Searching docs/ for .md files.",
              "run_command", sh("find docs -name '*.md'"), ok=("@find_md",),
              err=("find: 'docs': No such file or directory",),
              vague=("find: 'docs/private': Permission denied\ndocs/index.md",)),
            A("Show the folder tree of the scripts directory.", "Running tree on scripts/.",
              "run_command", sh("tree scripts"), ok=("@tree",),
              err=("scripts [error opening dir]\n\n0 directories, 0 files",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Get the forecast for Lisbon from the weather API.", "Calling the forecast "
              "endpoint.", "http_request",
              {"method": "GET", "url": "https://weather.example.org/v1/forecast?city=Lisbon"},
              host="weather.example.org",
              ok=("status: 200\nbody: {{\"city\": \"Lisbon\", \"temp_c\": {t}, \"conditions\": "
                  "\"sunny\"}}",)),
            A("Register a webhook for new invoices.", "Registering the webhook.",
              "http_request",
              {"method": "POST", "url": "https://billing.example.org/v2/webhooks",
               "body": {"event": "invoice.created", "url": "https://hooks.acme.io/inv"}},
              host="billing.example.org",
              ok=("status: 201\nbody: {{\"id\": \"wh_{hexid}\", \"event\": \"invoice.created\", "
                  "\"active\": true}}",),
              vague=("status: 207\nbody: {{\"created\": 1, \"failed\": 1}}",)),
            A("Remove the old API key k_7731.", "Deleting key k_7731.", "http_request",
              {"method": "DELETE", "url": "https://billing.example.org/v2/keys/k_7731"},
              host="billing.example.org",
              ok=("status: 200\nbody: {{\"deleted\": true, \"id\": \"k_7731\"}}",)),
        ),
        {
            -1: ("status: 403\nbody: {{\"message\": \"Forbidden: missing scope keys:write\"}}",
                 "status: 429\nbody: {{\"error\": \"rate_limited\", \"retry_after\": {k}}}",
                 "status: 502\nbody: <html><head><title>502 Bad Gateway</title></head></html>",
                 "curl: (7) Failed to connect to {host} port 443 after {ms} ms: "
                 "Couldn't connect to server",
                 "status: 400\nbody: {{\"errors\": [{{\"field\": \"url\", \"code\": "
                 "\"invalid\"}}]}}"),
        },
    ),
    ToolKind(
        (
            A("Raise the price of all mugs by 10%.", "Updating the mug prices.", "run_sql",
              {"query": "UPDATE products SET price = price * 1.1 WHERE category = 'mug';"},
              table="products",
              ok=("Query OK, {n} rows affected (0.0{k} sec)\nRows matched: {n}  Changed: {n}  "
                  "Warnings: 0",),
              vague=("Query OK, 0 rows affected (0.00 sec)\nRows matched: 0  Changed: 0  "
                     "Warnings: 0",)),
            A("Add a shipped_at column to the orders table.", "Altering the orders table.",
              "run_sql", {"query": "ALTER TABLE orders ADD COLUMN shipped_at DATETIME NULL;"},
              table="orders",
              ok=("Query OK, 0 rows affected (0.{k}2 sec)\nRecords: 0  Duplicates: 0  "
                  "Warnings: 0",)),
            A("Show the three biggest customers by revenue.", "Querying revenue per customer.",
              "run_sql",
              {"query": "SELECT name, SUM(total) AS revenue FROM invoices GROUP BY name "
                        "ORDER BY revenue DESC LIMIT 3;"},
              table="invoices", ok=("@mysql_customers",)),
        ),
        {
            -1: ("ERROR 1146 (42S02): Table 'shop.{table}' doesn't exist",
                 "ERROR 1064 (42000): You have an error in your SQL syntax; check the manual "
                 "for the right syntax to use near '{sqltok}' at line 1",
                 "ERROR 2002 (HY000): Can't connect to local MySQL server through socket "
                 "'/var/run/mysqld/mysqld.sock' (2)",
                 "ERROR 1045 (28000): Access denied for user 'app'@'localhost' (using "
                 "password: YES)"),
        },
    ),
    ToolKind(
        (
            A("Clone the design-system repo.", "Cloning acme/design-system.", "run_command",
              sh("git clone git@github.com:acme/design-system.git"),
              ok=("Cloning into 'design-system'...\nremote: Enumerating objects: {n}, done.\n"
                  "Receiving objects: 100% ({n}/{n}), {kb} KiB | 2.1 MiB/s, done.\n"
                  "Resolving deltas: 100% ({k}/{k}), done.",),
              err=("Cloning into 'design-system'...\ngit@github.com: Permission denied "
                   "(publickey).\nfatal: Could not read from remote repository.",)),
            A("Switch to the release-2.4 branch.", "Checking out release-2.4.", "run_command",
              sh("git checkout release-2.4"),
              ok=("Switched to branch 'release-2.4'\nYour branch is up to date with "
                  "'origin/release-2.4'.",),
              err=("error: pathspec 'release-2.4' did not match any file(s) known to git",
                   "error: Your local changes to the following files would be overwritten by "
                   "checkout:\n\tsrc/index.ts\nPlease commit your changes or stash them before "
                   "you switch branches.\nAborting")),
            A("Tag the current commit as v1.8.0.", "Creating the tag.", "run_command",
              sh("git tag v1.8.0"), ok=("[exit 0]",),
              err=("fatal: tag 'v1.8.0' already exists",)),
            A("Stash my uncommitted work.", "Stashing the changes.", "run_command",
              sh("git stash"),
              ok=("Saved working directory and index state WIP on main: {sha} tweak header "
                  "spacing",),
              vague=("No local changes to save",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Build the Rust CLI in release mode.", "Running cargo build --release.",
              "run_command", sh("cargo build --release"),
              ok=("   Compiling cli v0.3.1 (/home/dev/cli)\n    Finished `release` profile "
                  "[optimized] target(s) in {sec}s",),
              err=("error[E0308]: mismatched types\n --> src/main.rs:{line}:{col}\n  |\n  |   "
                   "  let n: u32 = \"5\";\n  |                  ^^^ expected `u32`, found "
                   "`&str`\n\nerror: could not compile `cli` (bin \"cli\") due to 1 previous "
                   "error",),
              vague=("warning: unused variable: `cfg`\n --> src/main.rs:{line}:{col}\n"
                     "[build output cut off]",)),
            A("Compile Main.java.", "Compiling with javac.", "run_command", sh("javac Main.java"),
              ok=("[exit 0]",),
              err=("Main.java:{line}: error: cannot find symbol\n        "
                   "System.out.printn(\"hi\");\n                  ^\n  symbol:   method "
                   "printn(String)\n1 error",
                   "zsh: command not found: javac")),
            A("Build the .NET service.", "Running dotnet build.", "run_command",
              sh("dotnet build src/Api"),
              ok=("Build succeeded.\n    0 Warning(s)\n    0 Error(s)\n\nTime Elapsed "
                  "00:00:0{k}.{n}",),
              err=("Build FAILED.\n\nProgram.cs({line},{col}): error CS1002: ; expected "
                   "[/src/Api/Api.csproj]\n    0 Warning(s)\n    1 Error(s)",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Install axios in the frontend.", "Running npm install axios.", "run_command",
              sh("npm install axios"), pkg="axios"),
            A("Add lodash as a dependency.", "Installing lodash with npm.", "run_command",
              sh("npm install lodash"), pkg="lodash"),
        ),
        {
            1: ("added {n} packages, and audited {n}{k} packages in {sec}s\n\nfound 0 "
                "vulnerabilities",
                "up to date, audited {n}{k} packages in {sec}s"),
            -1: ("npm ERR! code ERESOLVE\nnpm ERR! ERESOLVE unable to resolve dependency tree\n"
                 "npm ERR! Could not resolve dependency: peer react@\"^17\" from {pkg}",
                 "npm ERR! code EACCES\nnpm ERR! syscall mkdir\nnpm ERR! path "
                 "/usr/lib/node_modules/{pkg}\nnpm ERR! errno -13",
                 "npm ERR! code ETIMEDOUT\nnpm ERR! network request to "
                 "https://registry.npmjs.org/{pkg} failed, reason: connect ETIMEDOUT"),
            0: ("npm WARN deprecated inflight@1.0.6: This module is not supported",),
        },
    ),
    ToolKind(
        (
            A("Restart the docker container named web.", "Restarting the web container.",
              "run_command", sh("docker restart web"), ok=("web",),
              err=("Error response from daemon: No such container: web",)),
            A("Sync the build folder to the server.", "Running rsync to the server.",
              "run_command", sh("rsync -az build/ deploy@10.0.0.5:/var/www/"),
              ok=("[exit 0]",
                  "sent {kb} bytes  received {n} bytes  {k}{n}.20 bytes/sec\ntotal size is "
                  "{kb}{k}  speedup is 1.{k}"),
              err=("ssh: connect to host 10.0.0.5 port 22: Connection timed out\nrsync: "
                   "connection unexpectedly closed (0 bytes received so far) [sender]\nrsync "
                   "error: unexplained error (code 255)",)),
            A("Scale the api deployment to 3 replicas.", "Scaling it with kubectl.",
              "run_command", sh("kubectl scale deployment/api --replicas=3"),
              ok=("deployment.apps/api scaled",),
              err=("Error from server (NotFound): deployments.apps \"api\" not found",
                   "error: You must be logged in to the server (Unauthorized)")),
            A("Point the current symlink at releases/42.", "Updating the symlink.",
              "run_command", sh("ln -sfn releases/42 current"), ok=("[exit 0]",),
              err=("ln: failed to create symbolic link 'current': Read-only file system",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Compute the error ratio from stats.json.", "Computing errors / requests.",
              "run_python",
              {"code": "import json\ns = json.load(open('stats.json'))\n"
                       "print(s['errors'] / s['requests'])"},
              ok=("0.0{k}{n}",),
              err=("Traceback (most recent call last):\n  File \"<string>\", line 3, in "
                   "<module>\nZeroDivisionError: division by zero",)),
            A("Parse the timestamp '2024-02-30' with datetime.", "Parsing it with "
              "datetime.fromisoformat.", "run_python",
              {"code": "from datetime import datetime\n"
                       "print(datetime.fromisoformat('2024-02-30'))"},
              err=("Traceback (most recent call last):\n  File \"<string>\", line 2, in "
                   "<module>\nValueError: day is out of range for month",)),
            A("Print the third item of the queue in queue.json.", "Reading queue.json.",
              "run_python",
              {"code": "import json\nprint(json.load(open('queue.json'))[2])"},
              ok=("{{'id': {n}, 'task': 'resize-images'}}",),
              err=("Traceback (most recent call last):\n  File \"<string>\", line 2, in "
                   "<module>\nIndexError: list index out of range",)),
        ),
        {},
    ),
    ToolKind(
        (
            A("Look up the current Node.js LTS version.", "Searching for the Node.js LTS.",
              "web_search", {"query": "Node.js LTS version"},
              ok=("1. Node.js Downloads: \"Node.js v20.15.0 (LTS)\" (nodejs.org/en/download)\n"
                  "2. Previous Releases (nodejs.org/en/about/previous-releases)",),
              vague=("Search returned 0 results.",),
              err=("SearchError: upstream provider unavailable (HTTP 503)",)),
        ),
        {},
    ),
)

HELDOUT_FILL = {
    "sqltok": ("SELCT", "FRM", "GROUP BYY"),
    "mdfiles": ("docs/index.md", "docs/install.md", "docs/api/auth.md", "docs/api/users.md",
                "docs/faq.md", "docs/changelog.md"),
    "scripts": ("deploy.sh", "seed_db.py", "rotate_logs.sh", "backup.sh", "lint.sh"),
    "customers": ("Northwind Ltd", "Blue Finch Co", "Harbor Goods", "Kestrel Labs"),
}
# fmt: on


POOLS = {
    "train": Pools(
        TRAIN_GOOD,
        TRAIN_MISTAKES,
        TRAIN_LONGS,
        TRAIN_FORMS,
        TRAIN_THANKS,
        TRAIN_MOVE_ON,
        TRAIN_CORRECTIONS,
        TRAIN_REDO,
        TRAIN_VAGUE,
        TRAIN_UNRELATED,
        TRAIN_TOOLS,
        TRAIN_FILL,
    ),
    "heldout": Pools(
        HELDOUT_GOOD,
        HELDOUT_MISTAKES,
        HELDOUT_LONGS,
        HELDOUT_FORMS,
        HELDOUT_THANKS,
        HELDOUT_MOVE_ON,
        HELDOUT_CORRECTIONS,
        HELDOUT_REDO,
        HELDOUT_VAGUE,
        HELDOUT_UNRELATED,
        HELDOUT_TOOLS,
        HELDOUT_FILL,
    ),
}


# Tool outputs built by code rather than by a format string.


def _lines(text: str) -> list[str]:
    return text.split("\n")


def _hex(rng: random.Random, width: int) -> str:
    return "".join(rng.choice("0123456789abcdef") for _ in range(width))


def render_listing(rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]) -> str:
    ext = {"logs": ".log", "db/migrations": ".sql"}.get(v["path"], ".py")
    names = [name for name in fill["files"] if name.endswith(ext)]
    return "\n".join(sorted(rng.sample(names, min(len(names), rng.randint(2, 5)))))


def render_listing_long(
    rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]
) -> str:
    rows = [
        f"-rw-r--r-- 1 dev dev {rng.randint(200, 90000)} Mar {rng.randint(1, 28)} "
        f"1{rng.randint(0, 9)}:{rng.randint(10, 59)} {name}"
        for name in _lines(render_listing(rng, v, fill))[:4]
    ]
    return "\n".join([f"total {rng.randint(8, 400)}", *rows])


def render_gitlog(rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]) -> str:
    return "\n".join(f"{_hex(rng, 7)} {msg}" for msg in rng.sample(fill["commits"], 3))


def render_psql_products(
    rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]
) -> str:
    ids = sorted(rng.sample(range(100, 999), 5), reverse=True)
    rows = [f" {i} | {name}" for i, name in zip(ids, rng.sample(fill["products"], 5), strict=True)]
    return "\n".join([" id  | name", "-----+-------------", *rows, "(5 rows)"])


def render_find_md(rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]) -> str:
    return "\n".join(rng.sample(fill["mdfiles"], rng.randint(2, 5)))


def render_tree(rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]) -> str:
    names = sorted(rng.sample(fill["scripts"], rng.randint(2, 4)))
    body = [f"├── {name}" for name in names[:-1]] + [f"└── {names[-1]}"]
    return "\n".join(["scripts", *body, "", f"0 directories, {len(names)} files"])


def render_mysql_customers(
    rng: random.Random, v: dict[str, str], fill: dict[str, tuple[str, ...]]
) -> str:
    totals = sorted((rng.randint(2000, 90000) for _ in range(3)), reverse=True)
    names = rng.sample(fill["customers"], 3)
    border = "+---------------+----------+"
    rows = [f"| {n:<13} | {t:>8} |" for n, t in zip(names, totals, strict=True)]
    return "\n".join(
        [border, "| name          | revenue  |", border, *rows, border, "3 rows in set (0.01 sec)"]
    )


RENDERERS: dict[str, Callable[[random.Random, dict[str, str], dict[str, tuple[str, ...]]], str]] = {
    "@listing": render_listing,
    "@listing_long": render_listing_long,
    "@gitlog": render_gitlog,
    "@psql_products": render_psql_products,
    "@find_md": render_find_md,
    "@tree": render_tree,
    "@mysql_customers": render_mysql_customers,
    "@content": lambda rng, v, fill: v["content"],
    "@content_json": lambda rng, v, fill: json.dumps({"path": v["path"], "content": v["content"]}),
    "@content_numbered": lambda rng, v, fill: "\n".join(
        f"{i:>3}  {line}" for i, line in enumerate(_lines(v["content"]), start=1)
    ),
    "@content_cut": lambda rng, v, fill: _lines(v["content"])[0] + "\n[... truncated]",
}


def fill_values(rng: random.Random, pools: Pools, params: dict[str, str]) -> dict[str, str]:
    """Random values for a tool-output template; the call's own params win."""
    n = rng.randint(3, 240)
    values = {
        "n": str(n),
        "k": str(rng.randint(1, 9)),
        "sec": f"{rng.uniform(0.3, 30):.2f}",
        "line": str(rng.randint(3, 180)),
        "col": str(rng.randint(2, 40)),
        "sha": _hex(rng, 7),
        "sha2": _hex(rng, 7),
        "hexid": _hex(rng, 8),
        "hexb": _hex(rng, 2),
        "mm": f"{rng.randint(1, 12):02d}",
        "dd": f"{rng.randint(1, 28):02d}",
        "mi": str(rng.randint(10, 59)),
        "ms": str(rng.randint(2, 90)),
        "ms2": str(rng.randint(2, 90)),
        "kb": str(rng.randint(40, 9000)),
        "t": str(rng.randint(9, 31)),
        "dots": "." * min(n, 24),
        "ver": f"{rng.randint(0, 3)}.{rng.randint(0, 30)}.{rng.randint(0, 9)}",
    }
    for slot, choices in pools.fill.items():
        values[slot] = rng.choice(choices)
    if "person" in values:
        values["email"] = values["person"].lower().replace(" ", ".") + "@example.com"
    values.update(params)
    return values


def tool_output(rng: random.Random, pools: Pools, action: Action, template: str) -> str:
    values = fill_values(rng, pools, action.params)
    if template.startswith("@"):
        return RENDERERS[template](rng, values, pools.fill)
    return template.format(**values)


CODE_LIKE = re.compile(r"[\[\]()%<>=_/\\]| -|^(git|ls) ")


class Cycle:
    """Draws from a pool in shuffled passes, so every entry is used before any repeats."""

    def __init__(self, rng: random.Random, pool: Sequence[Any]) -> None:
        self.rng, self.pool, self.queue = rng, list(pool), list[Any]()

    def next(self) -> Any:
        if not self.queue:
            self.queue = list(self.pool)
            self.rng.shuffle(self.queue)
        return self.queue.pop()


def quotas(size: int) -> dict[tuple[str, str, int], int]:
    """Items per (role, category, label): the MIX over ``size``, users split by category."""
    cells = {cell: round(size * share) for cell, share in MIX.items()}
    cells[("user", 1)] += size - sum(cells.values())
    out: dict[tuple[str, str, int], int] = {}
    for (role, label), count in cells.items():
        if role == "tool":
            name = {1: "tool_success", -1: "tool_error", 0: "tool_ambiguous"}[label]
            out[(role, name, label)] = count
            continue
        split = {name: round(count * share) for name, share in USER_SPLIT[label].items()}
        first = next(iter(split))
        split[first] += count - sum(split.values())
        out.update({(role, name, label): n for name, n in split.items()})
    return out


def make_item(
    split: str,
    category: str,
    label: int,
    task: str,
    output: str,
    role: str,
    text: str,
    hint: str | None = None,
    call: Action | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": output}
    if call is not None:
        message["tool_calls"] = [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": call.tool, "arguments": json.dumps(call.args)},
            }
        ]
    response = {key: value for key, value in message.items() if key != "role"}
    return {
        "label": label,
        "agent_output": {"messages": [{"role": "user", "content": task}, message]},
        "response": response,
        "next_state": {"role": role, "content": text},
        "request_metadata": {"category": category, "split": split},
        "hint": hint,
    }


def sentence_case(phrase: str) -> str:
    """The phrase with a capital first letter, unless it reads as code (``ls -a``, ``xs[-1]``)."""
    return phrase if CODE_LIKE.search(phrase) else phrase[:1].upper() + phrase[1:]


def slots(right: str, wrong: str) -> dict[str, str]:
    return {
        "right": right,
        "wrong": wrong,
        "Right": sentence_case(right),
        "Wrong": sentence_case(wrong),
    }


class Maker:
    """Builds one split's items from its pools, one category at a time."""

    def __init__(self, split: str, rng: random.Random) -> None:
        self.split, self.rng, self.pools = split, rng, POOLS[split]
        p = self.pools
        self.cycles = {
            name: Cycle(rng, pool)
            for name, pool in (
                ("thanks", p.thanks),
                ("move_on", p.move_on),
                ("corrections", p.corrections),
                ("redo", p.redo),
                ("vague", p.vague),
                ("unrelated", p.unrelated),
                ("good", p.good),
                ("mistakes", p.mistakes),
                ("longs", p.longs),
            )
        }

    def draw(self, name: str) -> Any:
        return self.cycles[name].next()

    def any_output(self) -> tuple[str, str]:
        """A task and its output for a reply that does not depend on the output (thanks,
        vague, unrelated). In a split in OUTPUTS_FOR_ANY_REPLY it is any output, wrong and
        long ones too, so that an output never tells its label: the reply must."""
        pool = "good"
        if self.split in OUTPUTS_FOR_ANY_REPLY:
            pool = self.rng.choices(("good", "mistakes", "longs"), weights=(5, 3, 2))[0]
        drawn = self.draw(pool)
        return drawn.task, drawn.output

    def user(self, category: str, label: int) -> dict[str, Any]:
        rng, p = self.rng, self.pools
        if category == "user_move_on":
            good: Good = self.draw("good")
            text = self.draw("move_on").format(f=rng.choice(good.follow_ups))
            return make_item(self.split, category, label, good.task, good.output, "user", text)
        if label in (0, 1):
            task, output = self.any_output()
            if category == "user_confirm":
                text = self.draw("thanks")
            else:
                text = self.draw("vague" if category == "user_vague" else "unrelated")
            return make_item(self.split, category, label, task, output, "user", text)
        if category == "user_shorten":
            long: Long = self.draw("longs")
            form = rng.choice([f for f in p.forms if long.kind in f.kinds])
            return make_item(
                self.split, category, label, long.task, long.output, "user", form.reply, form.hint
            )
        mistake: Mistake = self.draw("mistakes")
        if category == "user_rephrase":
            text = mistake.rephrase
        elif category == "user_redo":
            text = self.draw("redo")
        elif mistake.right is None or (mistake.fixes and rng.random() < 0.35):
            text = rng.choice(mistake.fixes)
        else:
            text = self.draw("corrections").format(**slots(mistake.right, mistake.wrong or ""))
        return make_item(
            self.split, category, label, mistake.task, mistake.output, "user", text, mistake.hint
        )

    def tool(self, category: str, label: int) -> dict[str, Any]:
        """An output of one call, the call drawn evenly among those that have outputs with
        this label, the output among that call's own and its kind's shared templates."""
        choices = [
            templates
            for kind in self.pools.tools
            for action in kind.actions
            if (
                templates := [
                    (action, t)
                    for t in (*action.outputs.get(label, ()), *kind.outputs.get(label, ()))
                ]
            )
        ]
        action, template = self.rng.choice(self.rng.choice(choices))
        text = tool_output(self.rng, self.pools, action, template)
        return make_item(
            self.split, category, label, action.task, action.say, "tool", text, call=action
        )

    def build(self, size: int) -> list[dict[str, Any]]:
        items, seen = [], set()
        for (role, category, label), count in quotas(size).items():
            made = 0
            for _ in range(count * 60):
                if made == count:
                    break
                item = self.user(category, label) if role == "user" else self.tool(category, label)
                key = (
                    item["agent_output"]["messages"][0]["content"],
                    item["response"]["content"],
                    item["next_state"]["content"],
                )
                if key in seen:
                    continue
                seen.add(key)
                items.append(item)
                made += 1
            if made < count:
                raise SystemExit(f"{self.split}: only {made}/{count} distinct {category} items")
        self.rng.shuffle(items)
        return items


def words(text: str) -> int:
    return len(text.split())


def check_item(item: dict[str, Any]) -> None:
    """Length limits, and a hint exactly where a user reply is -1."""
    task = item["agent_output"]["messages"][0]["content"]
    output = item["response"]["content"]
    role, text = item["next_state"]["role"], item["next_state"]["content"]
    where = f"{item['request_metadata']['category']}: {text[:40]!r}"
    assert words(task) <= MAX_WORDS["task"], f"task too long: {task!r}"
    assert words(output) <= MAX_WORDS["output"], f"output too long: {output[:40]!r}"
    assert words(text) <= MAX_WORDS["next"], f"next state too long: {where}"
    if role == "tool":
        assert len(_lines(text)) <= MAX_TOOL_LINES, f"tool output over 12 lines: {where}"
    if item["request_metadata"]["category"] == "user_shorten":
        assert 40 <= words(output) <= 90, f"shorten target not 40-90 words: {output[:40]!r}"
    needs_hint = role == "user" and item["label"] == -1
    assert (item["hint"] is not None) == needs_hint, f"hint mismatch: {where}"
    if needs_hint:
        sentences = len(re.findall(r"[.!?](?:\s|$)", item["hint"]))
        assert 1 <= sentences <= 3, f"hint not 1-3 sentences: {item['hint']!r}"


def reply_slots(p: Pools) -> set[str]:
    """Every reply phrasing and template a split can use."""
    slots = {*p.thanks, *p.move_on, *p.corrections, *p.redo, *p.vague, *p.unrelated}
    slots |= {f.reply for f in p.forms}
    slots |= {m.rephrase for m in p.mistakes} | {fix for m in p.mistakes for fix in m.fixes}
    slots |= {f for g in p.good for f in g.follow_ups}
    return slots


def tool_shapes(p: Pools) -> set[str]:
    """Every tool-output template a split can use (outputs built by code are named)."""
    return {
        template
        for kind in p.tools
        for outputs in (kind.outputs, *(action.outputs for action in kind.actions))
        for texts in outputs.values()
        for template in texts
    }


def texts(items: list[dict[str, Any]]) -> dict[str, set[str]]:
    return {
        "task": {i["agent_output"]["messages"][0]["content"] for i in items},
        "assistant output": {i["response"]["content"] for i in items},
        "reply": {i["next_state"]["content"] for i in items if i["next_state"]["role"] == "user"},
        "tool output": {
            i["next_state"]["content"] for i in items if i["next_state"]["role"] == "tool"
        },
    }


def check_splits(splits: dict[str, list[dict[str, Any]]]) -> None:
    """No task, output, reply or tool-output text, and no template, in both splits; one label
    per next-state text within a split."""
    train, heldout = POOLS["train"], POOLS["heldout"]
    shared_slots = (reply_slots(train) & reply_slots(heldout)) | (
        (tool_shapes(train) & tool_shapes(heldout)) - set(RENDERERS)
    )
    assert not shared_slots, f"template slots in both splits: {sorted(shared_slots)[:5]}"
    a, b = texts(splits["train"]), texts(splits["heldout"])
    for name in a:
        both = a[name] & b[name]
        assert not both, f"{name} in both splits: {sorted(both)[:3]}"
    for split, items in splits.items():
        labels: dict[tuple[str, str], set[int]] = {}
        for item in items:
            check_item(item)
            state = item["next_state"]
            labels.setdefault((state["role"], state["content"]), set()).add(item["label"])
        mixed = [text for text, seen in labels.items() if len(seen) > 1]
        assert not mixed, f"{split}: a next state with two labels: {mixed[:3]}"
        lines = [json.dumps(item, ensure_ascii=False) for item in items]
        assert len(set(lines)) == len(lines), f"{split}: duplicate lines"


def summary(split: str, items: list[dict[str, Any]]) -> str:
    counts = Counter((i["request_metadata"]["category"], i["label"]) for i in items)
    t = texts(items)
    rows = [f"{split}: {len(items)} items"]
    rows += [f"  {category:<16} {label:>2}: {n}" for (category, label), n in sorted(counts.items())]
    rows.append(
        f"  distinct replies {len(t['reply'])}, tool outputs {len(t['tool output'])}, "
        f"tasks {len(t['task'])}, assistant outputs {len(t['assistant output'])}"
    )
    return "\n".join(rows)


def main() -> None:
    splits = {
        split: Maker(split, random.Random(SEED + index)).build(SIZES[split])
        for index, split in enumerate(SIZES)
    }
    check_splits(splits)
    for split, items in splits.items():
        path = HERE / f"{split}.jsonl"
        path.write_text("".join(json.dumps(i, ensure_ascii=False) + "\n" for i in items))
        print(summary(split, items))


if __name__ == "__main__":
    main()
