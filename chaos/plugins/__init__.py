"""The extension points: the Injector and Check contracts and the entry-point registry that finds them."""
