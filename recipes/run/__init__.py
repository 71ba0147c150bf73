"""One ``recipes fit|validate|test|predict`` run: the CLI class and its errors, the recipe options, the trainer and
its settings, the callback table and group, the sizes linked from the data, the run's description and record."""
