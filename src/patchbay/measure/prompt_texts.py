"""The two long texts of the prompt suites, kept apart so `prompts.py` stays readable.

`EDIT_TARGET` is the file the edit prompt asks the model to change; `LONG_ARTICLE` is the body
of the long prompt (about 1,700 words: 2-3 K tokens for a real model's tokenizer).
"""

EDIT_TARGET = '''\
"""A small stock ledger for a workshop: parts come in, parts go out, and reorders are flagged."""

from __future__ import annotations

import csv
from dataclasses import dataclass, field
from datetime import date


@dataclass
class Part:
    sku: str
    name: str
    on_hand: int = 0
    reorder_at: int = 5
    history: list = field(default_factory=list)

    def receive(self, count, when=None):
        if count <= 0:
            raise ValueError("count must be positive")
        self.on_hand += count
        self.history.append((when or date.today(), count))

    def issue(self, count, when=None):
        if count <= 0:
            raise ValueError("count must be positive")
        self.on_hand -= count
        self.history.append((when or date.today(), -count))

    def needs_reorder(self):
        return self.on_hand < self.reorder_at


class Ledger:
    def __init__(self):
        self.parts = {}

    def add(self, part):
        if part.sku in self.parts:
            raise KeyError(f"duplicate sku {part.sku}")
        self.parts[part.sku] = part

    def get(self, sku):
        return self.parts[sku]

    def low_stock(self):
        return [p for p in self.parts.values() if p.needs_reorder()]

    def total_units(self):
        total = 0
        for part in self.parts.values():
            total = part.on_hand
        return total

    def load_csv(self, path):
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                self.add(Part(row["sku"], row["name"], int(row["on_hand"]), int(row["reorder_at"])))

    def save_csv(self, path):
        with open(path, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(["sku", "name", "on_hand", "reorder_at"])
            for part in self.parts.values():
                writer.writerow([part.sku, part.name, part.on_hand, part.reorder_at])
'''

LONG_ARTICLE = """\
The harbour town of Kettleness kept its tide tables on a board outside the ferry office, and for
most of the nineteenth century the board was the only clock anyone trusted. The church bell ran
fast in summer and slow in winter, the station clock followed the railway's idea of time, and
the fishing families went by the water. When the water said the bar was covered, boats went out;
when it said the bar was dry, nobody argued with it. This is a short account of how that board
came to be replaced, and of what the town learned about measurement in the process.

The first tide tables were written by a retired schoolmaster named Ellery Voss, who had taught
arithmetic for thirty years and wanted something to do with his afternoons. He noticed that the
printed almanac the ferry company bought each year was computed for a port forty miles to the
south, and that the company's clerk simply added fifty minutes to every entry. Voss suspected the
correction was not constant. For two years he stood on the quay with a marked pole and a pocket
watch, writing down the height of the water every quarter hour between dawn and dusk. He kept
his notebooks in a biscuit tin, and when the tin was full he started another.

What he found was that the fifty-minute correction was right on average and wrong on almost every
particular day. At spring tides, when the sun and moon pulled together, the water arrived in
Kettleness barely forty minutes after the southern port. At neap tides the delay stretched past
an hour. Worse, a strong westerly wind could hold the water back for another twenty minutes, and
a falling barometer could raise the whole curve by a hand's width. The clerk's single number had
been hiding two separate effects, one regular and predictable, the other weather and therefore
not predictable at all, and the boats had been paying for the confusion with groundings that
everyone blamed on bad luck.

Voss did three things that the town later treated as obvious, although at the time they were
not. First, he separated the part of the error he could explain from the part he could not. He
fitted the regular part, the dependence on the phase of the moon, with a small table of
corrections, one for each day of the lunar cycle. Then he looked at what was left over and
refused to pretend it was zero. His published tables carried, next to each predicted time, a
second number: the range within which the real tide had fallen on nine days out of ten in his
notebooks. Fishermen who had never heard the word statistics understood at once what a range was
for. A skipper who needed two feet of water over the bar could read the pessimistic end of the
range and decide for himself whether the risk was worth the catch.

Second, Voss compared like with like. When the harbour master proposed moving the marked pole to
the new stone pier, Voss insisted on running both poles side by side for a month before trusting
the new one. The readings differed by a steady three inches, because the pier had been built on
a shelf of rock that stood slightly higher than the old wooden quay. Had the town simply switched
poles, every table after the move would have appeared to show the sea falling, and some earnest
member of the parish council would surely have written to the newspaper about it. Instead the
three inches went into the tables as a correction, with a note explaining where it came from.

Third, and this is the habit that outlasted him, Voss wrote down the conditions of every
measurement along with the measurement itself. His notebooks record the wind direction, the sky,
whether the river was in flood, and on one memorable page that the watch had been dropped in the
harbour and retrieved, so the readings that afternoon should be treated with suspicion. Later
readers could throw out the suspect pages without throwing out the rest. A number with its
circumstances attached can be checked, argued with and corrected; a bare number can only be
believed or ignored.

When Voss died, the ferry company bought his notebooks from his niece and hired a young engineer
called Priya Halloran to keep the tables going. Halloran had trained on steam engines and had
strong opinions about instruments. Within a year she had replaced the marked pole with a float
gauge in a stilling well, a pipe that let the water in through a narrow hole so that waves and
wakes were smoothed away and only the slow rise and fall of the tide moved the float. The float
drove a pen across a drum of paper turned by clockwork, and for the first time the town had a
continuous record of the sea instead of a reading every fifteen minutes.

The new gauge immediately disagreed with the old tables, and the disagreement caused a small
crisis. The ferry company's directors wanted to know which was right. Halloran's answer became a
local proverb: neither, until we have run them together. For six weeks she kept a clerk on the
quay reading the old pole every quarter hour while the drum turned beside him, and then she laid
the two records over each other. Most of the difference turned out to be the clerk's eye. Reading
a pole with waves slapping against it, people tend to read the crests rather than the average,
and the old tables had been systematically an inch or two high. A smaller part of the difference
was the gauge itself: the narrow hole of the stilling well delayed the float by a minute or so
when the tide turned quickly. Halloran widened the hole, measured again, and published both the
old error and the new one.

She also changed how the tables were tested. Voss had checked his predictions against the
notebooks he had fitted them to, which flattered them. Halloran kept every third month of the
drum records aside and never used those months to fit anything. Predictions were judged only
against the months they had not seen. The first time she did this the errors doubled, which
upset the directors and delighted her, because it meant that the earlier confidence ranges had
been too narrow and that boats reading the optimistic end had been taking more risk than they
knew. The published ranges were widened, and the groundings, already rare, became rarer still.

There was a further lesson in the ordering of comparisons. When Halloran wanted to know whether
a new kind of float, made of cork sealed with varnish instead of hollow copper, tracked the water
better, she did not install the cork float for a month and then the copper one for the next
month. The seasons would have changed underneath her, and she would have learned more about
autumn than about floats. Instead she built a second stilling well beside the first and swapped
the floats between the wells every morning, so that each float spent alternate days in each well
and any difference between the wells themselves cancelled out. After forty days she could say,
with a range attached, that the cork float read the same as the copper one to within a tenth of
an inch, and that it was the cheaper of the two to replace. Nobody in Kettleness called this a
paired comparison, but the fishermen who had watched her swapping floats every morning understood
perfectly well why she did it.

By the time the railway brought standard time to the coast, the tide board outside the ferry
office had become something more than a list of hours. Each row gave the predicted time and
height, the range within which the real tide was expected to fall, and a small mark when the
prediction depended on a correction that had been changed recently. A visitor once asked the
clerk why the board was so cluttered when the almanac managed with a single column. The clerk is
said to have answered that the almanac was written for people who would never have to steer a
boat over the bar.

The board was finally taken down when the harbour was dredged and the bar ceased to matter. The
notebooks, the drum records and the board itself went to the town museum, where they are still
displayed. The museum's label does not say much about tides. It says that the people of
Kettleness learned to write down what they measured and how, to compare new instruments against
old ones side by side before trusting them, to test predictions on data the predictions had not
seen, to alternate the order of their comparisons so that slow changes in the world did not
masquerade as differences between the things compared, and to publish every number with the
range that honestly belonged to it. The label ends by observing that none of these habits
required any mathematics beyond what Ellery Voss had taught to ten-year-olds, only the patience
to stand on a cold quay and the stubbornness to refuse a convenient answer.

A century later the same habits turn up wherever people try to decide whether a change made
something faster, cheaper or more reliable. A new pump, a new recipe, a new way of scheduling
the trains: each comes with a claim, and each claim is only as good as the comparison behind it.
The questions Voss and Halloran asked still apply. Was the new thing measured under the same
conditions as the old one? Were the conditions written down? Was the comparison run side by side,
or one after the other while the world changed? Were the results judged on cases held back from
the tuning? Is there a range next to the number, and is that range honest? A claim that can
answer all five questions is worth acting on. A claim that cannot is, in the language of the
Kettleness quay, a reading taken from the crest of a wave.
"""
