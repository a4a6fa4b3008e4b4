"""The faults area's machinery: short-lived worlds whose ranks can be killed or measured
(:mod:`.world`), the scenarios they run (:mod:`.scenarios`) and the damage done to a
checkpoint's files before a load (:mod:`.damage`)."""
