"""Larkspur Harbor: a small invented town website (wiki, shop, accounts, ferry timetable) and its tasks.

Every fact is made up, so a model cannot answer from memory: it has to browse. The tasks need
different browser skills:

| skill | task ids |
|---|---|
| follow a link from the start page | 0, 3 |
| follow two links (an article that links to another) | 1, 9 |
| read a table | 2 |
| use a search form (the article is linked from nowhere) | 4 |
| open a product page | 5 |
| click a button that reveals content with JavaScript | 6 |
| page through a catalogue | 7 |
| log in with a form (cookie session) | 8, 10 |
| choose an option in a select and submit | 11 |

:mod:`gym_llm.tasks.site_server` renders these records as HTML.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCOUNTS", "ARTICLES", "FERRY", "PRODUCTS", "SITE_TASKS", "Article", "Product", "SiteTask"]


@dataclass(frozen=True)
class Article:
    """A wiki article. ``body`` paragraphs may hold ``[[slug|text]]`` links; ``table`` is (header, rows)."""

    slug: str
    title: str
    body: tuple[str, ...]
    listed: bool = True  # shown in the wiki index (unlisted ones are found only by searching)
    table: tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None = None


@dataclass(frozen=True)
class Product:
    """A shop product; ``specs`` are only rendered when the page's button is clicked (JavaScript)."""

    item_id: int
    name: str
    price: str
    blurb: str
    specs: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class SiteTask:
    """A question, its accepted answers (first = reference), and the browser skill it needs."""

    question: str
    answers: tuple[str, ...]
    skill: str


ARTICLES: tuple[Article, ...] = (
    Article("larkspur-harbor", "Larkspur Harbor", (
        "Larkspur Harbor is a fishing town on the Greywater coast. It was founded in 1791 by "
        "[[agnes-thorncliffe|Agnes Thorncliffe]], who built its first pier.",
        "The town is known for the [[greywater-point-lighthouse|Greywater Point Lighthouse]] and for the "
        "yearly [[kelp-festival|Kelp Festival]].",
        "Census figures:",
    ), table=(("Census year", "Residents"), (("1900", "2,314"), ("1950", "4,087"), ("2000", "6,952")))),
    Article("greywater-point-lighthouse", "Greywater Point Lighthouse", (
        "The Greywater Point Lighthouse stands 31 metres tall at the mouth of the harbour. It was first lit "
        "in 1874, and its lamp can be seen from 19 nautical miles.",
        "It was designed by the engineer [[tobias-merrow|Tobias Merrow]].",
    )),
    Article("tobias-merrow", "Tobias Merrow", (
        "Tobias Merrow (1832-1901) was a civil engineer, born in Ellesport. Besides the Greywater Point "
        "Lighthouse he designed the stone bridge over Brindle Creek.",
    )),
    Article("agnes-thorncliffe", "Agnes Thorncliffe", (
        "Agnes Thorncliffe (1748-1820), the founder of Larkspur Harbor, was born in Harwick. She ran a "
        "salt-fish trade before she settled on the Greywater coast.",
    )),
    Article("kelp-festival", "Kelp Festival", (
        "The Kelp Festival has been held every year on 14 September since 1923. Its signature dish is "
        "smoked kelp bread.",
    )),
    Article("old-mill", "Old Mill on Brindle Creek", (
        "The Old Mill on Brindle Creek ground barley for the town until it closed in 1911. Its wheel "
        "still turns for visitors in summer.",
    ), listed=False),
)

PRODUCTS: tuple[Product, ...] = (
    Product(1, "Oilskin jacket", "$64.00", "A waxed cotton jacket for wet decks.",
            (("Weight", "1.1 kg"), ("Colour", "Yellow"))),
    Product(2, "Rope fender", "$18.75", "Hand-knotted from manila rope.", (("Weight", "0.9 kg"), ("Length", "40 cm"))),
    Product(3, "Ship's bell", "$120.00", "Cast bronze, with a lanyard.", (("Weight", "3.4 kg"), ("Diameter", "20 cm"))),
    Product(4, "Sea chart of the Greywater coast", "$22.00", "Soundings from the 1968 survey.", (("Scale", "1:50,000"),)),
    Product(5, "Kelp soap", "$6.50", "Made in the harbour with local kelp.", (("Weight", "0.1 kg"),)),
    Product(6, "Brass tide clock", "$86.50", "Shows the tide, not the time.", (("Weight", "0.7 kg"), ("Diameter", "17 cm"))),
    Product(7, "Storm lantern", "$42.00", "Stays lit in a gale.", (("Weight", "1.8 kg"), ("Burn time", "22 hours"))),
    Product(8, "Net mending kit", "$15.25", "Needles, gauge and twine.", (("Pieces", "12"),)),
    Product(9, "Folding telescope", "$79.00", "Brass and leather, 20x zoom.", (("Weight", "0.6 kg"), ("Zoom", "20x"))),
    Product(10, "Pocket compass", "$24.00", "Liquid-filled, luminous dial.", (("Weight", "0.05 kg"),)),
    Product(11, "Lobster pot", "$58.00", "Willow, made to the old pattern.", (("Weight", "2.6 kg"),)),
    Product(12, "Tin whistle", "$9.00", "In D; plays every harbour song.", (("Key", "D"),)),
)
PRODUCTS_PER_PAGE = 4

ACCOUNTS: dict[str, tuple[str, str, tuple[tuple[str, str], ...]]] = {
    # username: (password, full name, orders newest first as (number, status))
    "mira": ("saltwater", "Mira Vance", (("HS-40317", "shipped"), ("HS-38820", "delivered"))),
    "tomas": ("ropewalk", "Tomas Reyes", (("HS-39982", "processing"), ("HS-35101", "delivered"))),
}

FERRY: dict[str, tuple[str, ...]] = {
    # destination: departure times from Larkspur Harbor
    "Skerry Isle": ("07:15", "11:30", "16:05"),
    "Gannet Rock": ("08:40", "13:10", "17:40"),
    "Wick Holm": ("09:55", "15:20"),
}

SITE_TASKS: tuple[SiteTask, ...] = (
    SiteTask("In what year was the Greywater Point Lighthouse first lit?", ("1874",), "link"),
    SiteTask("In which town was the engineer who designed the Greywater Point Lighthouse born?", ("Ellesport",),
             "two links"),
    SiteTask("How many residents did Larkspur Harbor have in the 1950 census?", ("4,087", "4087"), "table"),
    SiteTask("On which date in September is the Kelp Festival held every year?",
             ("14 September", "September 14", "14", "14th September", "September 14th", "the 14th"), "link"),
    SiteTask("What grain did the Old Mill on Brindle Creek grind?", ("barley",), "search form"),
    SiteTask("What is the price of the brass tide clock in the Harbor Supply shop?",
             ("$86.50", "86.50", "86.50 dollars", "$86.5", "86.5"), "product page"),
    SiteTask("How much does the storm lantern sold by Harbor Supply weigh, according to its specifications?",
             ("1.8 kg", "1.8 kilograms", "1.8"), "JavaScript button"),
    SiteTask("Which product is listed last in the Harbor Supply catalogue?", ("Tin whistle",), "pagination"),
    SiteTask("Log in to the Harbor Supply shop with username 'mira' and password 'saltwater'. What is the number of "
             "her most recent order?", ("HS-40317", "#HS-40317"), "login form"),
    SiteTask("Where was the founder of Larkspur Harbor born?", ("Harwick",), "two links"),
    SiteTask("Log in to the Harbor Supply shop with username 'tomas' and password 'ropewalk'. What is the status "
             "of his most recent order?", ("processing",), "login form"),
    SiteTask("According to the ferry timetable, at what time does the last ferry of the day leave for Gannet Rock?",
             ("17:40", "5:40 pm", "17.40"), "select form"),
)
"""The built-in tasks of ``LLMBrowser-v0`` (task id = index)."""
