"""A sample third-party vendor, "Quill": an agent that runs one command per hook firing."""
