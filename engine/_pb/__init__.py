"""patchbay's additions to the engine. Every behaviour here sits behind a PB_* knob that is
off by default; with every knob unset the engine serves exactly what upstream serves.
Upstream files only carry thin hooks into these modules."""
