"""The cases of bench/judge_cases.py, family by family: each rule family's specs ``(prompt key, rule parameters,
reply, near-miss?)``, built from the texts of ``judge_case_texts.py``. The rule run on the reply labels each case
(``judge_cases._agreement``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Callable

from judge_case_rules import count_words
from judge_case_texts import (ACCELERATE, EXACT, FOLLOW_UP, LONG, PLANNING, RAINFALL, REALLY_REPLY, SHORT, VERY_INSIDE,
                              VERY_REPLY, _LANG_TEXT)


def _pick(limits: tuple[int, ...], pred: Callable[[int], bool], last: bool) -> int:
    chosen = [limit for limit in limits if pred(limit)]
    return chosen[-1] if last else chosen[0]


_ROUND = (10, 15, 20, 25, 30, 40, 50, 60, 75, 80, 100, 120, 150, 200, 250, 300)


def _limit_above(reply: str) -> int:
    """A round word count clearly above the reply's (by 15% or more)."""
    return _pick(_ROUND, lambda n: n >= math.ceil(count_words(reply) * 1.15), last=False)


def _limit_below(reply: str) -> int:
    """A round word count clearly below the reply's (by 20% or more)."""
    return _pick(_ROUND, lambda n: n <= math.floor(count_words(reply) * 0.8), last=True)


def _lower_except(text: str, *keep: str) -> str:
    """``text`` lowercased, except the given words keep their capitals (one stray capital: a near-miss)."""
    out = text.lower()
    for word in keep:
        out = re.sub(rf"(?<!\w){re.escape(word.lower())}(?!\w)", word, out, count=1)
    return out


# A spec: (prompt key, params, reply, near-miss?)
Spec = tuple[str, dict, str, bool]


def _max_words_specs() -> list[Spec]:
    specs: list[Spec] = []
    for i, key in enumerate(("water", "interview", "pasta", "blackhole", "exercise", "sleep", "ww1", "photo",
                             "hiking", "coding")):
        # Alternate which length passes, so a judge cannot score by length alone.
        short_ok = i % 2 == 0
        specs.append((key, {"max_words": (_limit_above if short_ok else _limit_below)(SHORT[key])}, SHORT[key], False))
        specs.append((key, {"max_words": (_limit_below if short_ok else _limit_above)(LONG[key])}, LONG[key], False))
    for name, limit in (("w20", 20), ("w21", 20), ("w30", 30), ("w31", 30), ("w50", 50), ("w51", 50),
                        ("w100", 100), ("w101", 100)):
        key, _, text = EXACT[name]
        specs.append((key, {"max_words": limit}, text, True))
    return specs


def _min_words_specs() -> list[Spec]:
    specs: list[Spec] = []
    for i, key in enumerate(("interest", "bottle", "vaccine", "grocery", "ml", "plant", "sky", "rainy", "cover",
                             "paris")):
        long_ok = i % 2 == 0
        specs.append((key, {"min_words": (_limit_below if long_ok else _limit_above)(LONG[key])}, LONG[key], False))
        specs.append((key, {"min_words": (_limit_above if long_ok else _limit_below)(SHORT[key])}, SHORT[key], False))
    for name, limit in (("w49", 50), ("w50", 50), ("w79", 80), ("w80", 80), ("w99", 100), ("w100", 100),
                        ("w31", 30)):
        key, _, text = EXACT[name]
        specs.append((key, {"min_words": limit}, text, True))
    return specs


def _keywords_specs() -> list[Spec]:
    k = "keywords"
    return [
        ("water", {k: ("evaporation", "precipitation", "groundwater")}, LONG["water"], False),
        ("interview", {k: ("research", "star")}, LONG["interview"], False),  # "STAR": case does not matter
        ("pasta", {k: ("garlic", "basil", "olive oil")}, LONG["pasta"], False),
        ("blackhole", {k: ("event horizon", "gravity")}, LONG["blackhole"], False),
        ("exercise", {k: ("heart", "mood", "sleep")}, SHORT["exercise"], False),
        ("sleep", {k: ("caffeine", "bedroom")}, SHORT["sleep"], False),
        ("ml", {k: ("data", "model", "algorithm")}, LONG["ml"], False),
        ("sky", {k: ("Rayleigh", "wavelength")}, LONG["sky"], False),
        ("paris", {k: ("Louvre", "Montmartre", "Seine")}, LONG["paris"], False),
        ("vaccine", {k: ("antibodies", "memory cells")}, LONG["vaccine"], False),
        ("ww1", {k: ("alliances", "nationalism", "Sarajevo")}, SHORT["ww1"], False),
        ("coding", {k: ("Python", "project")}, LONG["coding"], False),
        ("hiking", {k: ("map", "water", "first-aid kit")}, LONG["hiking"], False),
        ("climate", {k: ("average", "thirty years")}, LONG["climate"], False),
        # fails
        ("interview", {k: ("research", "salary")}, LONG["interview"], False),
        ("pasta", {k: ("garlic", "oregano")}, SHORT["pasta"], False),
        ("blackhole", {k: ("event horizon",)}, SHORT["blackhole"], False),
        ("exercise", {k: ("heart", "mood")}, LONG["exercise"], False),
        ("paris", {k: ("Louvre", "Orsay")}, SHORT["paris"], False),
        ("vaccine", {k: ("antibodies", "booster")}, SHORT["vaccine"], False),
        ("hiking", {k: ("map", "sunscreen")}, SHORT["hiking"], False),
        ("rainy", {k: ("fort", "puddles")}, SHORT["rainy"], False),
        ("bottle", {k: ("stainless steel",)}, SHORT["bottle"], False),
        # near-misses: the keyword only inside a longer word, or a related form
        ("water", {k: ("rain",)}, RAINFALL, True),  # "rainfall", "Raindrops"
        ("sky", {k: ("wave", "scatter")}, LONG["sky"], True),  # "wavelength", "scattered"
        ("coding", {k: ("Python", "project")}, SHORT["coding"], True),  # "projects"
        ("grocery", {k: ("plan", "list")}, PLANNING, True),  # "planning"
        ("water", {k: ("evaporation", "condensation", "precipitation")}, LONG["water"], True),  # "condenses"
    ]


def _forbidden_specs() -> list[Spec]:
    w = "word"
    return [
        ("sleep", {w: "alcohol"}, SHORT["sleep"], False),
        ("exercise", {w: "diet"}, SHORT["exercise"], False),
        ("pasta", {w: "cream"}, LONG["pasta"], False),
        ("blackhole", {w: "Einstein"}, LONG["blackhole"], False),
        ("ml", {w: "AI"}, LONG["ml"], False),
        ("paris", {w: "museum"}, LONG["paris"], False),
        ("climate", {w: "global"}, SHORT["climate"], False),
        ("vaccine", {w: "virus"}, SHORT["vaccine"], False),
        ("rainy", {w: "TV"}, LONG["rainy"], False),
        ("photo", {w: "sugar"}, LONG["photo"], False),
        ("ww1", {w: "Hitler"}, LONG["ww1"], False),
        # near-misses that pass: the word only inside a longer word
        ("water", {w: "rain"}, RAINFALL, True),  # "rainfall", "Raindrops"
        ("interest", {w: "rate"}, ACCELERATE, True),  # "accelerate"
        ("exercise", {w: "very"}, VERY_INSIDE, True),  # "everywhere", "every"
        # fails
        ("sleep", {w: "caffeine"}, LONG["sleep"], False),
        ("exercise", {w: "weight"}, LONG["exercise"], False),
        ("pasta", {w: "sugar"}, SHORT["pasta"], False),
        ("ml", {w: "artificial"}, SHORT["ml"], False),
        ("water", {w: "rain"}, LONG["water"], False),
        ("paris", {w: "tower"}, SHORT["paris"], False),  # "Tower"
        ("vaccine", {w: "virus"}, LONG["vaccine"], False),
        ("coding", {w: "Python"}, SHORT["coding"], False),
        ("grocery", {w: "cheap"}, EXACT["w101"][2], False),
        # near-misses that fail: once, capitalised, or hyphenated
        ("sleep", {w: "very"}, VERY_REPLY, True),  # "Very good question!"
        ("interview", {w: "CV"}, LONG["interview"], True),  # once, near the end
        ("bottle", {w: "plastic"}, SHORT["bottle"], True),  # "plastic-free"
        ("hiking", {w: "cotton"}, LONG["hiking"], True),  # "Cotton stays wet"
        ("interview", {w: "really"}, REALLY_REPLY, True),
    ]



def _language_specs() -> list[Spec]:
    def spec(name: str, language: str, near: bool = False) -> Spec:
        key, text = _LANG_TEXT[name]
        return (key, {"language": language}, text, near)

    def english(key: str, language: str, long: bool = False) -> Spec:
        return (key, {"language": language}, (LONG if long else SHORT)[key], False)

    return [
        spec("fr_water", "fr"), spec("fr_interview", "fr"), spec("fr_pasta", "fr"), spec("fr_sleep", "fr"),
        spec("fr_paris", "fr"), spec("es_exercise", "es"), spec("es_grocery", "es"), spec("es_sky", "es"),
        spec("de_photo", "de"), spec("de_hiking", "de"), spec("de_coding", "de"),
        english("blackhole", "en", long=True), english("ml", "en"),
        spec("fr_cover", "fr", near=True),  # French with English loanwords ("storytelling", "networking")
        # fails
        english("water", "fr", long=True), english("interview", "fr"), english("pasta", "de"),
        english("sky", "es", long=True), spec("es_rainy", "fr"), spec("fr_water", "es"), spec("de_ml", "en"),
        spec("fr_paris", "en"), spec("es_exercise", "de"), spec("de_hiking", "fr"),
        spec("en_fr_greeting", "fr", near=True),  # English between a French greeting and sign-off
        spec("en_es_signoff", "es", near=True),  # English with a Spanish sign-off
        spec("es_grocery", "fr", near=True),  # Spanish, not French: a related language
    ]


def _json(obj: dict, indent: int | None = 2) -> str:
    return json.dumps(obj, indent=indent, ensure_ascii=False)


_RECIPE = {"name": "Simple tomato sauce",
           "ingredients": ["3 tbsp olive oil", "1 onion, finely chopped", "2 garlic cloves, sliced",
                           "400 g can of whole peeled tomatoes", "salt", "a handful of fresh basil"],
           "steps": ["Soften the onion in the oil for 8 minutes.", "Add the garlic and cook for 1 minute.",
                     "Add the tomatoes, crush them and season with salt.", "Simmer for 20 minutes, then add basil."]}
_INTERVIEW = {"tips": ["Research the company and the role", "Prepare STAR stories", "Practise out loud",
                       "Arrive ten minutes early", "Ask two or three questions at the end"],
              "mistakes_to_avoid": ["Badmouthing a former employer", "Checking your phone",
                                    "Not knowing your own CV"]}
_HIKING = {"essentials": ["map", "headlamp", "first-aid kit", "water filter", "sun protection"],
           "clothing": ["base layer", "fleece", "waterproof jacket", "spare socks"],
           "food": ["nuts", "dried fruit", "wraps", "a simple dinner"]}
_WATER = {"stages": ["evaporation", "condensation", "precipitation", "collection"],
          "summary": "Water evaporates, condenses into clouds, falls as rain or snow and collects in rivers, lakes "
                     "and oceans before evaporating again."}
_BOTTLE = {"product_name": "TrailFlow 750",
           "tagline": "Cold for 24 hours, hot for 12, plastic-free forever.",
           "features": ["double-wall vacuum insulation", "food-grade stainless steel", "leak-proof lid",
                        "fits most cup holders"]}
_PARIS = {"morning": "Eiffel Tower at opening time, then the Louvre.",
          "afternoon": "Lunch in the Marais, Notre-Dame and the Latin Quarter.",
          "evening": "Sunset at Sacré-Cœur and dinner in Montmartre."}
_ML = {"definition": "Machine learning is a way of building programs that learn patterns from data.",
       "types": ["supervised", "unsupervised", "reinforcement"],
       "examples": ["spam filters", "product recommendations", "speech recognition"]}
_INTEREST = {"principal": 1000, "rate": 0.05, "years": 10, "final_amount": 1628.89}
_SLEEP = {"habits": ["same bedtime every day", "morning daylight", "cool, dark bedroom"],
          "avoid": ["caffeine after lunch", "screens in the last hour", "late heavy meals"]}
_WW1 = {"causes": ["militarism", "alliances", "imperialism", "nationalism"],
        "trigger": "The assassination of Archduke Franz Ferdinand in Sarajevo", "year": 1914}
_CLIMATE = {"weather": "Short-term conditions: today's temperature, rain and wind.",
            "climate": "The long-term average of weather in a region, usually over 30 years."}
_PLANT = {"light": "Bright, indirect light for most plants.",
          "water": "Only when the top 2-3 cm of soil are dry.",
          "soil": "Free-draining potting mix in a pot with drainage holes."}
_VACCINE = {"summary": "A vaccine trains the immune system to recognise a germ without causing the disease.",
            "steps": ["The vaccine introduces a harmless antigen.", "B cells make antibodies.",
                      "Memory cells remember the antigen.", "A later infection is fought off quickly."]}


def _without(obj: dict, key: str) -> dict:
    return {k: v for k, v in obj.items() if k != key}


def _renamed(obj: dict, old: str, new: str) -> dict:
    return {(new if k == old else k): v for k, v in obj.items()}


def _json_specs() -> list[Spec]:
    k = "keys"
    return [
        ("pasta", {k: ("name", "ingredients", "steps")}, _json(_RECIPE), False),
        ("interview", {k: ("tips", "mistakes_to_avoid")}, _json(_INTERVIEW), False),
        ("hiking", {k: ("essentials", "clothing", "food")}, _json(_HIKING, indent=None), False),
        ("water", {k: ("stages", "summary")}, _json(_WATER), False),
        ("bottle", {k: ("product_name", "tagline", "features")}, _json(_BOTTLE, indent=4), False),
        ("paris", {k: ("morning", "afternoon", "evening")}, _json(_PARIS), False),
        ("ml", {k: ("definition", "types")}, _json(_ML), False),  # an extra key is allowed
        ("interest", {k: ("principal", "rate", "years", "final_amount")}, _json(_INTEREST, indent=None), False),
        ("sleep", {k: ("habits", "avoid")}, _json(_SLEEP), False),
        ("ww1", {k: ("causes", "trigger", "year")}, _json(_WW1), False),
        ("climate", {k: ("weather", "climate")}, "\n" + _json(_CLIMATE) + "\n", False),  # surrounding whitespace
        ("plant", {k: ("light", "water", "soil")}, _json(_PLANT, indent=None), False),
        ("vaccine", {k: ("summary", "steps")}, _json(_VACCINE), False),
        # fails
        ("pasta", {k: ("name", "ingredients", "steps", "time")}, _json(_RECIPE), True),  # missing "time"
        ("interview", {k: ("tips", "mistakes_to_avoid")}, _json(_without(_INTERVIEW, "mistakes_to_avoid")), True),
        ("hiking", {k: ("essentials", "clothing", "food")}, "```json\n" + _json(_HIKING) + "\n```", True),
        ("water", {k: ("stages", "summary")},
         "Sure! Here is the water cycle as JSON:\n\n" + _json(_WATER), False),
        ("bottle", {k: ("product_name", "tagline", "features")},
         _json(_BOTTLE).replace('"fits most cup holders"', '"fits most cup holders",'), True),  # trailing comma
        ("paris", {k: ("morning", "afternoon", "evening")}, str(_PARIS), False),  # a Python dict: single quotes
        ("ml", {k: ("definition", "types", "examples")}, _json(_renamed(_ML, "examples", "example")), True),
        ("interest", {k: ("principal", "rate", "years", "final_amount")},
         _json({"Principal": 1000, "Rate": 0.05, "Years": 10, "Final_amount": 1628.89}), True),  # capitalised keys
        ("sleep", {k: ("habits", "avoid")}, _json([_SLEEP]), False),  # an array, not an object
        ("ww1", {k: ("causes", "trigger", "year")}, _json(_WW1)[:-40], False),  # cut off mid-object
        ("climate", {k: ("weather", "climate")},
         "Weather is short-term conditions; climate is the long-term average of weather in a region.", False),
        ("plant", {k: ("light", "water", "soil")}, _json(_without(_PLANT, "soil"), indent=None), True),
        ("vaccine", {k: ("summary", "steps")},
         _json(_VACCINE) + "\n\nLet me know if you want more detail on any step.", True),  # text after the object
    ]


_ITEMS: dict[str, list[str]] = {
    "interview": ["Research the company, its products and recent news.",
                  "Prepare four or five stories using the STAR method.",
                  "Practise your answers out loud with a friend.",
                  "Arrive ten minutes early with copies of your CV.",
                  "Ask two or three thoughtful questions at the end.",
                  "Send a short thank-you email the same day."],
    "sleep": ["Go to bed and wake up at the same time every day.",
              "Stop drinking caffeine after lunch.",
              "Keep your bedroom cool, dark and quiet.",
              "Put your phone away an hour before bed.",
              "Get outside in daylight each morning."],
    "hiking": ["Layers: base layer, fleece and a waterproof jacket.",
               "Broken-in boots and a spare pair of socks.",
               "Map, headlamp and a small first-aid kit.",
               "At least two litres of water plus a filter.",
               "Easy snacks like nuts, dried fruit and bars."],
    "grocery": ["Plan your meals for the week before you shop.",
                "Write a list and stick to it.",
                "Compare unit prices on the shelf labels.",
                "Choose store brands over big names.",
                "Buy fruit and vegetables that are in season.",
                "Freeze leftovers instead of throwing them away."],
    "exercise": ["A stronger heart and lower blood pressure",
                 "Easier weight control",
                 "Stronger muscles and bones",
                 "Better mood and less stress",
                 "Deeper, more restful sleep"],
    "rainy": ["Build a blanket fort and read stories inside it.",
              "Bake muffins or pizza together.",
              "Set up a treasure hunt around the house.",
              "Put on a puppet show.",
              "Make an obstacle course with cushions."],
    "ww1": ["Militarism and the arms race between the great powers",
            "A system of rival alliances that could turn a local war into a general one",
            "Imperial competition for colonies and markets",
            "Nationalism, especially in the Balkans",
            "The assassination of Archduke Franz Ferdinand in June 1914"],
    "plant": ["Put it where it gets the right light for its type.",
              "Water only when the top few centimetres of soil are dry.",
              "Use a pot with drainage holes.",
              "Feed it lightly in spring and summer.",
              "Keep it away from radiators and cold draughts."],
    "paris": ["Morning: the Eiffel Tower, then the Louvre.",
              "Lunch: falafel in the Marais.",
              "Afternoon: Notre-Dame, Sainte-Chapelle and the Latin Quarter.",
              "Evening: sunset at Sacré-Cœur in Montmartre."],
    "coding": ["Pick one language, such as Python.",
               "Follow a structured beginner course.",
               "Write a little code every day.",
               "Build a small project you care about.",
               "Read other people's code and ask for feedback."],
    "climate": ["Weather is short-term: hours to days.",
                "Climate is the long-term average, usually over 30 years.",
                "Weather is what you get; climate is what you expect.",
                "One cold winter does not change the climate."],
}

_INTROS = {
    "interview": "Here are my top tips:", "sleep": "A few habits make the biggest difference:",
    "hiking": "Here is a compact packing list:", "grocery": "Try these:", "exercise": "The main benefits are:",
    "rainy": "Some ideas the whole family can enjoy:", "ww1": "The main causes were:",
    "plant": "The basics of houseplant care:", "paris": "A simple plan for the day:",
    "coding": "A good path for beginners:", "climate": "The key differences:",
}


def _bullets(key: str, n: int, marker: str = "- ", intro: bool = True, outro: str | None = None) -> str:
    items = _ITEMS[key][:n]
    if marker == "1.":
        lines = [f"{i}. {item}" for i, item in enumerate(items, 1)]
    else:
        lines = [marker + item for item in items]
    parts = ([_INTROS[key], ""] if intro else []) + lines + (["", outro] if outro else [])
    return "\n".join(parts)


def _bullets_specs() -> list[Spec]:
    c = "count"
    return [
        ("interview", {c: 3}, _bullets("interview", 3), False),
        ("sleep", {c: 4}, _bullets("sleep", 4, intro=False), False),
        ("hiking", {c: 5}, _bullets("hiking", 5), False),
        ("grocery", {c: 3}, _bullets("grocery", 3, outro="Together these can cut your bill by a fifth."), False),
        ("exercise", {c: 4}, _bullets("exercise", 4), False),
        ("rainy", {c: 5}, _bullets("rainy", 5, intro=False, outro="Have fun!"), False),
        ("ww1", {c: 3}, _bullets("ww1", 3), False),
        ("plant", {c: 4}, _bullets("plant", 4), False),
        ("paris", {c: 4}, _bullets("paris", 4), False),
        ("coding", {c: 3}, _bullets("coding", 3, intro=False), False),
        ("climate", {c: 2}, _bullets("climate", 2), False),
        ("interview", {c: 5}, _bullets("interview", 5, outro="Good luck!"), False),
        ("hiking", {c: 3}, _bullets("hiking", 3, intro=False), False),
        # fails
        ("interview", {c: 3}, _bullets("interview", 4), True),  # one too many
        ("sleep", {c: 4}, _bullets("sleep", 3), True),  # one too few
        ("hiking", {c: 5}, _bullets("hiking", 5, marker="* "), True),  # "* " bullets
        ("grocery", {c: 3}, _bullets("grocery", 3, marker="• "), True),  # "•" bullets
        ("exercise", {c: 4}, _bullets("exercise", 4, marker="1."), True),  # a numbered list
        ("rainy", {c: 5}, _bullets("rainy", 5, marker="-"), True),  # no space after the hyphen
        ("ww1", {c: 3}, _bullets("ww1", 5), False),
        ("plant", {c: 4}, SHORT["plant"], False),  # prose, no list
        ("paris", {c: 3}, _bullets("paris", 4), True),
        ("coding", {c: 3}, _bullets("coding", 5, intro=False), False),
        ("climate", {c: 4}, _bullets("climate", 2), False),
        ("grocery", {c: 5}, _bullets("grocery", 6), True),
        ("exercise", {c: 2}, LONG["exercise"], False),
    ]


_CASUAL_LOWER = ("honestly the easiest win is a fixed wake-up time, 7 days a week. then: no coffee after 2pm, a cool "
                 "dark room, and no phone in bed. give it two weeks before you judge it!")
_LOWER_WITH_I = ("what worked for me: i stopped scrolling in bed and started reading instead. I also keep the room "
                 "cold and get up at the same time every day, even on sundays.")


def _lowercase_specs() -> list[Spec]:
    return [
        ("water", {}, SHORT["water"].lower(), False),
        ("interview", {}, SHORT["interview"].lower(), False),
        ("pasta", {}, SHORT["pasta"].lower(), False),
        ("sleep", {}, _CASUAL_LOWER, False),
        ("photo", {}, LONG["photo"].lower(), False),
        ("coding", {}, SHORT["coding"].lower(), False),
        ("interest", {}, SHORT["interest"].lower(), False),
        ("vaccine", {}, LONG["vaccine"].lower(), False),
        ("grocery", {}, SHORT["grocery"].lower(), False),
        ("sky", {}, SHORT["sky"].lower(), False),
        ("rainy", {}, LONG["rainy"].lower(), False),
        ("climate", {}, SHORT["climate"].lower(), False),
        ("hiking", {}, _bullets("hiking", 4).lower(), False),
        # fails
        ("exercise", {}, SHORT["exercise"], False),
        ("blackhole", {}, LONG["blackhole"], False),
        ("ml", {}, SHORT["ml"], False),
        ("bottle", {}, SHORT["bottle"], False),
        ("plant", {}, LONG["plant"], False),
        ("cover", {}, SHORT["cover"], False),
        ("ww1", {}, LONG["ww1"], False),
        # near-misses: lowercase but for one word
        ("coding", {}, _lower_except(LONG["coding"], "Python"), True),
        ("paris", {}, _lower_except(SHORT["paris"], "Eiffel"), True),
        ("sleep", {}, _LOWER_WITH_I, True),
        ("interview", {}, LONG["interview"].lower().capitalize(), True),  # only the first letter
        ("ww1", {}, _lower_except(SHORT["ww1"], "Sarajevo"), True),
        ("bottle", {}, _lower_except(LONG["bottle"], "BPA"), True),
    ]


def _question_specs() -> list[Spec]:
    def ask(key: str, long: bool = False) -> str:
        return (LONG if long else SHORT)[key] + " " + FOLLOW_UP[key]

    return [
        ("water", {}, ask("water"), False),
        ("interview", {}, ask("interview", long=True), False),
        ("pasta", {}, ask("pasta"), False),
        ("blackhole", {}, ask("blackhole", long=True), False),
        ("exercise", {}, ask("exercise"), False),
        ("hiking", {}, ask("hiking"), False),
        ("interest", {}, ask("interest", long=True), False),
        ("ml", {}, ask("ml"), False),
        ("plant", {}, ask("plant"), False),
        ("rainy", {}, _bullets("rainy", 4) + "\n\n" + FOLLOW_UP["rainy"], False),
        ("sleep", {}, "Have you tried keeping exactly the same wake-up time every day, weekends included?", False),
        ("cover", {}, ask("cover") + "\n\n", True),  # trailing whitespace after the "?"
        ("paris", {}, "Is this your first time in Paris? " + ask("paris"), False),
        # fails
        ("water", {}, LONG["water"], False),
        ("sleep", {}, SHORT["sleep"], False),
        ("ww1", {}, LONG["ww1"], False),
        ("photo", {}, SHORT["photo"], False),
        ("coding", {}, "Why start with Python? " + SHORT["coding"], False),  # the question comes first
        ("vaccine", {}, LONG["vaccine"], False),
        ("grocery", {}, _bullets("grocery", 5), False),
        ("sky", {}, LONG["sky"], False),
        # near-misses: a question, then something after it
        ("hiking", {}, ask("hiking", long=True) + " Happy trails!", True),
        ("climate", {}, ask("climate") + " 🙂", True),
        ("bottle", {}, LONG["bottle"] + " (Need a version for a gift card?)", True),
        ("interview", {}, SHORT["interview"] + " A good one is \"What does success look like in this role?\"", True),
        ("ml", {}, ask("ml", long=True) + "\nCheers!", True),
    ]


_FAMILIES: dict[str, Callable[[], list[Spec]]] = {
    "max_words": _max_words_specs,
    "min_words": _min_words_specs,
    "keywords": _keywords_specs,
    "forbidden": _forbidden_specs,
    "language": _language_specs,
    "json_keys": _json_specs,
    "bullets": _bullets_specs,
    "lowercase": _lowercase_specs,
    "question_end": _question_specs,
}

