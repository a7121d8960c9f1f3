"""Short programs the chapters run to record what happens: what each rank sees, what a DDP or
FSDP step does, what memory the ranks hold, where a step's time goes, and the source article's
way to join a group. Each writes its records as JSON, which the chapter's cells and figures read.
"""
