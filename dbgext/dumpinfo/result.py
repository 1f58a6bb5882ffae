"""The result of ``dumpinfo``: every fact the renderers show, already derived."""

SCHEMA_VERSION = 1


class DumpInfoResult(object):
    """What one dump is.  ``facts`` is the backend's own description (header
    fields, parts, drivers...; see docs/json-schema/dumpinfo.md), ``layouts`` says
    for each kernel structure where its offsets come from, ``system_time`` is the
    header's FILETIME in ISO 8601 (UTC) or None, and ``problems`` is a ProblemLog."""

    def __init__(self, facts, layouts, system_time, problems):
        self.facts = facts
        self.layouts = layouts
        self.system_time = system_time
        self.problems = problems

    def get(self, name, default=None):
        return self.facts.get(name, default)

    def as_dict(self):
        document = {"schema_version": SCHEMA_VERSION}
        document.update((name, value) for name, value in self.facts.items() if name != "problems")
        document["system_time_utc"] = self.system_time
        document["layouts"] = [dict(layout) for layout in self.layouts]
        document["problems"] = self.problems.as_list()
        return document
