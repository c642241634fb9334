"""The ``synthetic-memory`` task: seeded event histories with distractors and exact answers.

Five categories, each with an answer that is a short exact string: a fact stated once
(single-session), a fact later changed (knowledge-update, the newest value counts), the
date of an event (temporal), a stated preference (preference), and a question about
something never mentioned (abstention, answer ``unknown``). Distractors state the same
kind of fact about other people, so keeping the wrong message does not help. The same
seed always gives the same items; history length is set in approximate tokens.

Evidence is marked for evidence recall (``budgetbench_core.evidence``): the user message
that states the answer carries ``metadata["evidence"]``, the exact sentence that must survive
(for temporal questions with its date header; for knowledge updates only the newest
statement, the one the answer needs). Abstention items have no evidence and no mark.
Strategies never see the marks, the answer, the category or ``item.metadata["evidence"]``
(``sandbox.PrivateView``); no other message key is grading-only, so ``hidden_metadata`` is empty.
"""

from __future__ import annotations

import random
from datetime import date, timedelta

from budgetbench_core import Item, Message, Task, hookimpl
from budgetbench_core.evidence import EVIDENCE_ID_KEY, EVIDENCE_KEY

CATEGORIES = ("single-session", "knowledge-update", "temporal", "preference", "abstention")

SYSTEM_PROMPT = (
    "You are an assistant with a long memory of your conversations with the user. Answer the user's "
    "last question with only the answer, in a few words. If the conversation does not contain the "
    "answer, reply exactly: unknown"
)

NAMES = [
    "Amara",
    "Bruno",
    "Chiara",
    "Dmitri",
    "Elif",
    "Farid",
    "Greta",
    "Hiro",
    "Ingrid",
    "Jonas",
    "Keira",
    "Lior",
    "Mateo",
    "Nadia",
    "Oskar",
    "Priya",
    "Quentin",
    "Rosa",
    "Soren",
    "Tamsin",
    "Ulla",
    "Viktor",
    "Wanda",
    "Xavi",
    "Yusuf",
    "Zora",
]
RELATIONS = [
    "dog",
    "cat",
    "parrot",
    "neighbour",
    "manager",
    "dentist",
    "landlord",
    "piano teacher",
    "tortoise",
    "business partner",
]
CITIES = [
    "Lisbon",
    "Tallinn",
    "Osaka",
    "Valparaiso",
    "Krakow",
    "Accra",
    "Quebec",
    "Ljubljana",
    "Hobart",
    "Tbilisi",
    "Cusco",
    "Bergen",
]
COLOURS = ["teal", "maroon", "ochre", "lavender", "charcoal", "saffron", "olive", "coral"]
DRINKS = ["green tea", "espresso", "kombucha", "hot chocolate", "mint tea", "oat latte", "lemonade"]
EVENTS = [
    "adopted a kitten",
    "ran my first marathon",
    "started a pottery class",
    "sold my old car",
    "planted an apple tree",
    "passed my driving test",
    "finished my thesis",
]
TOPICS = [
    (
        "a recipe",
        "Could you suggest a quick dinner with {x}?",
        "Try a one-pan dish: roast {x} with garlic, lemon and herbs for about twenty minutes.",
    ),
    (
        "a trip",
        "I am thinking about a weekend trip somewhere near {x}. Any ideas?",
        "A short trip near {x} could include a museum, a market walk and a local restaurant.",
    ),
    (
        "exercise",
        "How often should I stretch if I sit at a desk near {x} all day?",
        "Short stretches every hour help; a five minute routine near {x} is plenty.",
    ),
    (
        "a book",
        "Can you recommend a novel set in {x}?",
        "Look for a character-driven novel set in {x}; your library can suggest recent ones.",
    ),
    (
        "gardening",
        "My {x} plants keep wilting. What should I check?",
        "Check the soil moisture, drainage and light; {x} plants often suffer from overwatering.",
    ),
    (
        "budgeting",
        "How do I plan a monthly budget that includes {x}?",
        "List fixed costs first, then set a capped amount for {x} and review it weekly.",
    ),
]
FILLER_WORDS = ["tomatoes", "Lisbon", "basil", "the office", "mushrooms", "the river", "Seoul", "lentils", "peppers"]


def _date(start: date, days: int) -> str:
    return (start + timedelta(days=days)).isoformat()


class SyntheticMemory(Task):
    """Options: ``items`` (default 50), ``history_tokens`` (default 4000, 1K-200K)."""

    name = "synthetic-memory"
    default_grader = "contains-answer"
    max_output_tokens = 24
    description = "Seeded synthetic histories: fact, knowledge update, temporal, preference, abstention."

    def __init__(self, items: int = 50, history_tokens: int = 4000, **options):
        super().__init__(items=int(items), history_tokens=int(history_tokens), **options)
        if not 200 <= int(history_tokens) <= 200_000:
            raise ValueError(f"synthetic-memory: history_tokens must be between 200 and 200000, got {history_tokens}")
        self.count = int(items)
        self.history_tokens = int(history_tokens)

    def data_files(self):
        """Items are generated from the seed: no file is read."""
        return []

    def load(self, limit, seed):
        count = self.count if limit is None else min(limit, self.count)
        for index in range(count):
            category = CATEGORIES[index % len(CATEGORIES)]
            yield self._item(index, category, random.Random(f"synthetic-memory:{seed}:{index}"))

    def load_wanted(self, limit, seed, wanted):
        """Ids are known before items are built: a resumed or sharded run builds only what it runs."""
        count = self.count if limit is None else min(limit, self.count)
        for index in range(count):
            category = CATEGORIES[index % len(CATEGORIES)]
            if wanted(f"synth-{index:05d}-{category}"):
                yield self._item(index, category, random.Random(f"synthetic-memory:{seed}:{index}"))

    # Each fact is (text said by the user, answer) ; distractors are about other people.
    def _facts(self, category: str, rng: random.Random):
        relation = rng.choice(RELATIONS)
        names = rng.sample(NAMES, 4)
        if category == "single-session":
            evidence = [f"By the way, my {relation}'s name is {names[0]}."]
            question, answer = f"What is my {relation}'s name?", names[0]
            distractors = [
                f"My friend {names[1]} has a {relation} called {names[2]}.",
                f"My cousin's {relation} is named {names[3]}.",
            ]
        elif category == "knowledge-update":
            old, new, other = rng.sample(CITIES, 3)
            evidence = [f"I live in {old} these days.", f"Big news: I have just moved from {old} to {new}."]
            question, answer = "Which city do I live in now?", new
            distractors = [f"My sister {names[1]} lives in {other}.", f"I once visited {other} for a conference."]
        elif category == "temporal":
            event = rng.choice(EVENTS)
            evidence = [f"Today I {event}!"]
            question, answer = f"On what date did I say that I {event}? Answer as YYYY-MM-DD.", None
            distractors = [
                f"My colleague {names[1]} {rng.choice(EVENTS)} last year.",
                f"{names[2]} told me she {event} a while ago.",
            ]
        elif category == "preference":
            liked, other1, other2 = rng.sample(DRINKS, 3)
            colour, other_colour = rng.sample(COLOURS, 2)
            if rng.random() < 0.5:
                evidence = [f"Honestly, {liked} is my favourite drink; I have it every morning."]
                question, answer = "What is my favourite drink?", liked
                distractors = [f"{names[1]} always orders {other1}.", f"I tried {other2} once but did not like it."]
            else:
                evidence = [f"My favourite colour is {colour}, I paint everything in it."]
                question, answer = "What is my favourite colour?", colour
                distractors = [f"{names[1]}'s favourite colour is {other_colour}.", "I used to like blue as a kid."]
        else:
            absent = rng.choice([r for r in RELATIONS if r != relation])
            evidence = []
            question, answer = f"What is my {absent}'s name?", "unknown"
            distractors = [f"My {relation}'s name is {names[0]}.", f"{names[1]} has a {absent} named {names[2]}."]
        return evidence, distractors, question, answer

    def _item(self, index: int, category: str, rng: random.Random) -> Item:
        evidence, distractors, question, answer = self._facts(category, rng)
        needed = evidence[-1:]  # the newest statement holds the answer (a knowledge update supersedes)
        start = date(2023, 1, 1) + timedelta(days=rng.randrange(300))
        # about 60 tokens per filler exchange, two exchanges per session
        sessions = max(len(evidence) + len(distractors) + 1, self.history_tokens // 120)
        planted: dict[int, list[str]] = {}
        slots = sorted(rng.sample(range(sessions - 1), len(evidence))) if evidence else []
        for slot, text in zip(slots, evidence):
            planted.setdefault(slot, []).append(text)
        for text in distractors:
            planted.setdefault(rng.randrange(sessions), []).append(text)
        history: list[Message] = []
        day = 0
        for session in range(sessions):
            day += rng.randint(1, 3)
            when = _date(start, day)
            meta = {"session_id": f"s{session:04d}", "timestamp": when}
            header = f"[{when}] "
            for turn in range(2):
                topic = rng.choice(TOPICS)
                word = rng.choice(FILLER_WORDS)
                user_text = header * (turn == 0) + topic[1].format(x=word)
                user_meta = meta
                if turn == 0 and session in planted:
                    user_text = header + " ".join(planted[session]) + " " + topic[1].format(x=word)
                    if category == "temporal" and answer is None and evidence and evidence[0] in planted[session]:
                        answer = when
                    if needed and needed[0] in planted[session]:
                        # evidence is planted before distractors, so it follows the date header directly
                        span = (header + needed[0]) if category == "temporal" else needed[0]
                        user_meta = {**meta, EVIDENCE_KEY: span, EVIDENCE_ID_KEY: f"{category}:s{session:04d}"}
                history.append(Message("user", user_text, user_meta))
                history.append(Message("assistant", topic[2].format(x=word), meta))
        query_date = _date(start, day + 1)
        return Item(
            id=f"synth-{index:05d}-{category}",
            history=tuple(history),
            query=Message("user", f"[{query_date}] {question}"),
            answer=answer,
            system=Message("system", SYSTEM_PROMPT),
            category=category,
            metadata={"evidence": evidence},
        )


@hookimpl
def register_tasks(register):
    register(SyntheticMemory)
