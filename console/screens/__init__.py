"""The console's screens: the dashboard, parameters, help, go-to-time."""
