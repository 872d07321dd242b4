"""The foundation every layer uses: the frozen config, the error types, atomic files, the loader registry."""
