"""Write examples/prompts.jsonl: questions with a known short answer, split train / held-out.

Each line is ``{"id", "split", "prompt", "answer", "aliases"}``. An answer to a
prompt is correct when ``answer`` or one of ``aliases`` appears in it as a whole
word, case-insensitive (``pipeline.learn.prompts.is_correct``). The families are
written by hand below; the split is seeded, per family, so every family is in
both splits and a rerun writes the same file. Standard library only.

    python examples/make_prompts.py [--seed 0] [--out examples/prompts.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

HELDOUT_SHARE = 0.28

ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]  # fmt: skip
TENS = ["twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def number_words(n: int) -> list[str]:
    """The ways of writing ``n`` (0-999) in words: 42 -> ["forty-two", "forty two"]."""
    if n < 20:
        return [ONES[n]]
    if n < 100:
        tens, ones = TENS[n // 10 - 2], n % 10
        return [tens] if ones == 0 else [f"{tens}-{ONES[ones]}", f"{tens} {ONES[ones]}"]
    hundreds, rest = f"{ONES[n // 100]} hundred", n % 100
    if rest == 0:
        return [hundreds, "a hundred"] if n == 100 else [hundreds]
    words = number_words(rest)
    return [f"{hundreds} and {w}" for w in words] + [f"{hundreds} {w}" for w in words]


def number(question: str, n: int) -> tuple[str, str, list[str]]:
    return question, str(n), number_words(n)


CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid",
    "Portugal": "Lisbon", "the United Kingdom": "London", "Ireland": "Dublin",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo",
    "Greece": "Athens", "Norway": "Oslo", "Sweden": "Stockholm", "Finland": "Helsinki",
    "Denmark": "Copenhagen", "Poland": "Warsaw", "Austria": "Vienna", "Hungary": "Budapest",
    "the Czech Republic": "Prague", "Belgium": "Brussels", "the Netherlands": "Amsterdam",
    "Switzerland": "Bern", "Canada": "Ottawa", "Mexico": "Mexico City", "Peru": "Lima",
    "Argentina": "Buenos Aires", "Chile": "Santiago", "Colombia": "Bogota",
    "Venezuela": "Caracas", "Cuba": "Havana", "Kenya": "Nairobi", "Ethiopia": "Addis Ababa",
    "Nigeria": "Abuja", "Ghana": "Accra", "Morocco": "Rabat", "Turkey": "Ankara",
    "Iran": "Tehran", "Iraq": "Baghdad", "Saudi Arabia": "Riyadh", "India": "New Delhi",
    "Pakistan": "Islamabad", "Bangladesh": "Dhaka", "Thailand": "Bangkok",
    "Vietnam": "Hanoi", "Indonesia": "Jakarta", "the Philippines": "Manila",
    "South Korea": "Seoul", "North Korea": "Pyongyang", "Australia": "Canberra",
    "New Zealand": "Wellington", "Ukraine": "Kyiv", "Romania": "Bucharest",
    "Bulgaria": "Sofia", "Serbia": "Belgrade", "Croatia": "Zagreb", "Iceland": "Reykjavik",
    "Afghanistan": "Kabul", "Nepal": "Kathmandu", "Malaysia": "Kuala Lumpur",
    "Lebanon": "Beirut", "Syria": "Damascus", "Israel": "Jerusalem", "Jordan": "Amman",
    "Qatar": "Doha", "Uganda": "Kampala", "Senegal": "Dakar", "Zimbabwe": "Harare",
    "Estonia": "Tallinn", "Latvia": "Riga", "Lithuania": "Vilnius",
}  # fmt: skip
CAPITAL_ALIASES = {
    "Bogota": ["Bogotá"], "Kyiv": ["Kiev"], "Reykjavik": ["Reykjavík"], "Beijing": ["Peking"],
    "New Delhi": ["Delhi"], "Bern": ["Berne"],
}  # fmt: skip

OPPOSITES = {
    "hot": ("cold", []), "up": ("down", []), "big": ("small", ["little"]),
    "fast": ("slow", []), "happy": ("sad", ["unhappy"]), "light": ("dark", ["heavy"]),
    "open": ("closed", ["shut"]), "full": ("empty", []), "early": ("late", []),
    "old": ("young", ["new"]), "wet": ("dry", []), "rich": ("poor", []),
    "hard": ("soft", ["easy"]), "tall": ("short", []), "loud": ("quiet", ["soft"]),
    "day": ("night", []), "left": ("right", []), "win": ("lose", []), "buy": ("sell", []),
    "push": ("pull", []), "thick": ("thin", []), "strong": ("weak", []),
    "true": ("false", []), "inside": ("outside", []), "above": ("below", ["beneath"]),
    "clean": ("dirty", []), "first": ("last", []), "north": ("south", []),
    "east": ("west", []), "high": ("low", []), "begin": ("end", ["finish"]),
    "friend": ("enemy", ["foe"]), "give": ("take", ["receive"]), "sweet": ("sour", ["bitter"]),
    "love": ("hate", []), "remember": ("forget", []), "arrive": ("leave", ["depart"]),
    "never": ("always", []), "sharp": ("blunt", ["dull"]), "cheap": ("expensive", []),
    "safe": ("dangerous", ["unsafe"]), "question": ("answer", []),
}  # fmt: skip

PLURALS = {
    "mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "goose": "geese",
    "man": "men", "woman": "women", "person": "people", "ox": "oxen", "cactus": "cacti",
    "knife": "knives", "leaf": "leaves", "wolf": "wolves", "half": "halves", "life": "lives",
    "wife": "wives", "loaf": "loaves", "potato": "potatoes", "tomato": "tomatoes",
    "hero": "heroes", "box": "boxes", "bus": "buses", "city": "cities", "baby": "babies",
    "party": "parties", "story": "stories", "church": "churches", "dish": "dishes",
    "fox": "foxes", "glass": "glasses", "shelf": "shelves", "thief": "thieves",
    "calf": "calves", "louse": "lice", "crisis": "crises", "analysis": "analyses",
    "fungus": "fungi", "nucleus": "nuclei",
}  # fmt: skip
PLURAL_ALIASES = {"cactus": ["cactuses"], "fungus": ["funguses"], "person": ["persons"]}

COUNTS = [
    ("How many legs does a spider have?", 8), ("How many legs does an insect have?", 6),
    ("How many legs does a dog have?", 4), ("How many legs does a bird have?", 2),
    ("How many days are there in a week?", 7), ("How many months are there in a year?", 12),
    ("How many hours are there in a day?", 24), ("How many minutes are there in an hour?", 60),
    ("How many seconds are there in a minute?", 60),
    ("How many days are there in a leap year?", 366),
    ("How many sides does a triangle have?", 3), ("How many sides does a square have?", 4),
    ("How many sides does a hexagon have?", 6), ("How many sides does an octagon have?", 8),
    ("How many sides does a pentagon have?", 5), ("How many arms does an octopus have?", 8),
    ("How many wheels does a bicycle have?", 2), ("How many wheels does a tricycle have?", 3),
    ("How many players are on a soccer team on the field?", 11),
    ("How many continents are there?", 7), ("How many planets are in the solar system?", 8),
    ("How many strings does a standard guitar have?", 6),
    ("How many fingers are on one human hand, counting the thumb?", 5),
    ("How many eggs are in a dozen?", 12), ("How many years are in a century?", 100),
    ("How many years are in a decade?", 10), ("How many colours are in a rainbow?", 7),
    ("How many hearts does an octopus have?", 3), ("How many weeks are there in a year?", 52),
    ("How many letters are in the English alphabet?", 26),
    ("How many days are there in a regular year?", 365),
    ("How many cents are in a dollar?", 100),
]  # fmt: skip

COLOURS = [
    ("What colour is the sky on a clear day?", "blue", []),
    ("What colour is grass?", "green", []),
    ("What colour is snow?", "white", []),
    ("What colour is coal?", "black", []),
    ("What colour is a ripe banana?", "yellow", []),
    ("What colour is blood?", "red", []),
    ("What colour is a ripe tomato?", "red", []),
    ("What colour are most leaves in summer?", "green", []),
    ("What colour is milk?", "white", []),
    ("What colour is a carrot?", "orange", []),
    ("What colour is an elephant?", "grey", ["gray"]),
    ("What colour is chocolate?", "brown", []),
    ("What colour is the inside of a lime?", "green", []),
    ("What colour is a lemon?", "yellow", []),
    ("What colour do you get by mixing blue and yellow?", "green", []),
    ("What colour do you get by mixing red and white?", "pink", []),
    ("What colour do you get by mixing red and blue?", "purple", ["violet"]),
    ("What colour do you get by mixing red and yellow?", "orange", []),
    ("What colour do you get by mixing black and white?", "grey", ["gray"]),
    ("What colour is a stop sign?", "red", []),
    ("What colour is the middle light of a traffic light?", "yellow", ["amber", "orange"]),
    ("What colour is a polar bear's fur?", "white", []),
    ("What colour is a crow?", "black", []),
    ("What colour is an emerald?", "green", []),
    ("What colour is a ruby?", "red", []),
    ("What colour is a sapphire usually?", "blue", []),
]  # fmt: skip

FACTS = [
    ("What do bees make?", "honey", []),
    ("Which planet is known as the Red Planet?", "Mars", []),
    ("Which planet do we live on?", "Earth", []),
    ("What is the largest ocean on Earth?", "Pacific", []),
    ("What is frozen water called?", "ice", []),
    ("What star is at the centre of our solar system?", "Sun", []),
    ("What is the largest planet in the solar system?", "Jupiter", []),
    ("Which animal is known as the king of the jungle?", "lion", []),
    ("What is the tallest animal in the world?", "giraffe", []),
    ("What is the largest animal in the world?", "blue whale", ["whale"]),
    ("What language is mostly spoken in Brazil?", "Portuguese", []),
    ("What language is mostly spoken in Mexico?", "Spanish", []),
    ("Which month comes after January?", "February", []),
    ("Which month comes after June?", "July", []),
    ("Which month comes before December?", "November", []),
    ("Which day comes after Monday?", "Tuesday", []),
    ("Which day comes before Friday?", "Thursday", []),
    ("Which day comes after Saturday?", "Sunday", []),
    ("What gas do plants take in from the air?", "carbon dioxide", ["CO2"]),
    ("What gas do people need to breathe to live?", "oxygen", []),
    ("At how many degrees Celsius does water boil at sea level?", "100", ["one hundred"]),
    ("At how many degrees Celsius does water freeze?", "0", ["zero"]),
    ("What do caterpillars turn into?", "butterflies", ["butterfly", "moths", "moth"]),
    ("What is a baby cat called?", "kitten", []),
    ("What is a baby dog called?", "puppy", ["pup"]),
    ("What is a baby cow called?", "calf", []),
    ("What is a baby sheep called?", "lamb", []),
    ("What is a baby horse called?", "foal", []),
    ("What animal says moo?", "cow", []),
    ("What metal is liquid at room temperature?", "mercury", []),
    ("What is the hardest natural substance?", "diamond", []),
    ("What organ pumps blood around the body?", "heart", []),
    ("What do you call a shape with three sides?", "triangle", []),
    ("What season comes after winter?", "spring", []),
    ("What season comes after summer?", "autumn", ["fall"]),
    ("Which is the closest planet to the Sun?", "Mercury", []),
    ("What do pandas mostly eat?", "bamboo", []),
    ("Who wrote Romeo and Juliet?", "Shakespeare", []),
    ("What is the chemical symbol for gold?", "Au", []),
    ("What is the chemical symbol for water?", "H2O", []),
    ("What is the longest river in Africa?", "Nile", []),
    ("Which continent is Egypt in?", "Africa", []),
    ("Which continent is Brazil in?", "South America", []),
]  # fmt: skip


def arithmetic(rng: random.Random, count: int) -> list[tuple[str, str, list[str]]]:
    """Small sums, differences and products, each asked once."""
    seen: set[str] = set()
    out: list[tuple[str, str, list[str]]] = []
    while len(out) < count:
        op = rng.choice("+-*")
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        if op == "-":
            a, b = max(a, b) + rng.randint(1, 9), min(a, b)
        question = {"+": f"What is {a} + {b}?", "-": f"What is {a} - {b}?",
                    "*": f"What is {a} times {b}?"}[op]  # fmt: skip
        result = {"+": a + b, "-": a - b, "*": a * b}[op]
        if question in seen or result in (a, b):  # "4 - 2": echoing the question is no answer
            continue
        seen.add(question)
        out.append(number(question, result))
    return out


def families(rng: random.Random) -> dict[str, list[tuple[str, str, list[str]]]]:
    return {
        "capital": [
            (f"What is the capital of {country}?", city, CAPITAL_ALIASES.get(city, []))
            for country, city in CAPITALS.items()
        ],
        "arithmetic": arithmetic(rng, 80),
        "opposite": [
            (f"What is the opposite of {word}?", answer, aliases)
            for word, (answer, aliases) in OPPOSITES.items()
        ],
        "plural": [
            (f"What is the plural of {word}?", plural, PLURAL_ALIASES.get(word, []))
            for word, plural in PLURALS.items()
        ],
        "count": [number(question, n) for question, n in COUNTS],
        "colour": COLOURS,
        "fact": FACTS,
    }


def rows(seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for family, questions in families(rng).items():
        order = list(range(len(questions)))
        rng.shuffle(order)
        heldout = set(order[: round(len(questions) * HELDOUT_SHARE)])
        for k, (prompt, answer, aliases) in enumerate(questions):
            out.append({
                "id": f"{family}-{k:03d}",
                "split": "heldout" if k in heldout else "train",
                "prompt": prompt,
                "answer": answer,
                "aliases": aliases,
            })  # fmt: skip
    rng.shuffle(out)  # the held-out prompts evaluated first (--eval-prompts) mix the families
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("prompts.jsonl"))
    args = parser.parse_args()
    written = rows(args.seed)
    args.out.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in written))
    heldout = sum(r["split"] == "heldout" for r in written)
    print(f"{args.out}: {len(written) - heldout} train, {heldout} held-out")


if __name__ == "__main__":
    main()
