#!/usr/bin/python3
"""Renders a kustomization offline: the subset of kustomize that deploy/ uses, nothing more.

kustomize and kubectl are not Debian packages, and CI reaches only Debian and PyPI, so CI renders
deploy/overlays/* with this file. Anything outside the subset below is an error naming the file
and the field, never silently ignored:

  kustomization.yaml  apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization, and only
    resources          local files (one or more YAML documents) and directories holding a
                       kustomization; no URLs, no files outside the tree being rendered
    namespace          set on every namespaced object (cluster-scoped kinds are left alone)
    labels             pairs added to metadata.labels; includeSelectors must be false; with
                       includeTemplates also to spec.template.metadata.labels
    patches            strategic merge patches given by path or inline, matched to exactly one
                       object by group, kind and name (no target, no JSON 6902, no $patch)
    images             name -> newName / newTag / digest in containers and initContainers
    configMapGenerator files and literals; options.disableNameSuffixHash must be true (name
                       hashing and reference rewriting are not implemented)

Transformers run in kustomize's order for these fields: patches, namespace, labels, images.
Where kubectl is installed, tests/deploy/test_kubectl_crosscheck.py checks that this renders
exactly what `kubectl kustomize` renders.

Usage: kustomize_render.py DIR   (prints the objects as a YAML stream; exit 1 on error)
"""

import copy
import os
import sys

import yaml

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
KNOWN_FIELDS = {"apiVersion", "kind", "resources", "namespace", "labels", "patches", "images",
                "configMapGenerator"}

# Kinds without a namespace (the ones a namespace transformer must leave alone).
CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  "PersistentVolume", "StorageClass", "PriorityClass", "RuntimeClass",
                  "DeviceClass", "ValidatingWebhookConfiguration",
                  "MutatingWebhookConfiguration", "APIService"}
# Kinds whose namespace references kustomize rewrites too; not implemented here.
NAMESPACE_REFERENCING = {"RoleBinding", "ClusterRoleBinding", "ValidatingWebhookConfiguration",
                         "MutatingWebhookConfiguration", "APIService"}

# Strategic merge keys of the Kubernetes lists deploy/ may patch (patchMergeKey in the API).
# Lists of maps not named here are replaced whole, as Kubernetes does for atomic lists.
MERGE_KEYS = {"containers": "name", "initContainers": "name", "ephemeralContainers": "name",
              "volumes": "name", "volumeMounts": "mountPath", "volumeDevices": "devicePath",
              "env": "name", "imagePullSecrets": "name", "hostAliases": "ip",
              "resourceClaims": "name"}


class RenderError(Exception):
    """A kustomization this renderer cannot render exactly as kustomize would."""


def _load_yaml_docs(path):
    try:
        with open(path, encoding="utf-8") as f:
            docs = [d for d in yaml.safe_load_all(f) if d is not None]
    except (OSError, yaml.YAMLError) as e:
        raise RenderError(f"{path}: cannot read YAML: {e}") from e
    return docs


def _find_kustomization(directory):
    found = [f for f in KUSTOMIZATION_FILES if os.path.isfile(os.path.join(directory, f))]
    if len(found) != 1:
        raise RenderError(f"{directory}: expected exactly one of {KUSTOMIZATION_FILES}, "
                          f"found {found}")
    return os.path.join(directory, found[0])


def _inside(root, path):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root + os.sep)


def _check_object(obj, where):
    if not isinstance(obj, dict):
        raise RenderError(f"{where}: a resource must be a mapping, got {type(obj).__name__}")
    for field in ("apiVersion", "kind"):
        if not isinstance(obj.get(field), str) or not obj[field]:
            raise RenderError(f"{where}: resource without '{field}'")
    meta = obj.get("metadata")
    if not isinstance(meta, dict) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise RenderError(f"{where}: {obj['kind']} without metadata.name")
    if obj["kind"] == "List" or obj["kind"].endswith("List"):
        raise RenderError(f"{where}: List objects are not supported")


def object_id(obj):
    """(group, kind, namespace, name): how kustomize tells resources apart."""
    api = obj["apiVersion"]
    group = api.split("/")[0] if "/" in api else ""
    meta = obj["metadata"]
    return (group, obj["kind"], meta.get("namespace", ""), meta["name"])


def _id_text(oid):
    group, kind, ns, name = oid
    return f"{kind}{'.' + group if group else ''} {ns + '/' if ns else ''}{name}"


def _merge_key(field, parent_path):
    if field == "ports":
        # Container ports merge on containerPort, Service ports on port.
        return "containerPort" if parent_path and parent_path[-1] in (
            "containers", "initContainers", "ephemeralContainers") else "port"
    return MERGE_KEYS.get(field)


def strategic_merge(original, patch, where, path=()):
    """Returns original with patch applied by Kubernetes' strategic merge rules (subset)."""
    if not isinstance(patch, dict) or not isinstance(original, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(original)
    for key, value in patch.items():
        if isinstance(key, str) and key.startswith("$"):
            raise RenderError(f"{where}: patch directive '{key}' at "
                              f"{'.'.join(path) or '<root>'} is not supported")
        if value is None:
            result.pop(key, None)
            continue
        if key not in result:
            result[key] = copy.deepcopy(value)
            continue
        current = result[key]
        if isinstance(value, dict) and isinstance(current, dict):
            result[key] = strategic_merge(current, value, where, path + (key,))
        elif (isinstance(value, list) and isinstance(current, list)
              and _merge_key(key, path) and all(isinstance(v, dict) for v in value + current)):
            result[key] = _merge_list(current, value, _merge_key(key, path), where,
                                      path + (key,))
        else:
            result[key] = copy.deepcopy(value)
    return result


def _merge_list(current, patch_items, merge_key, where, path):
    """Items of the patch first, in its order (merged into the original item of the same key),
    then the original items the patch did not name: the order kustomize produces."""
    merged = []
    used = set()
    for item in patch_items:
        if any(isinstance(k, str) and k.startswith("$") for k in item):
            raise RenderError(f"{where}: patch directive in list {'.'.join(path)} is not "
                              "supported")
        if merge_key not in item:
            raise RenderError(f"{where}: item of {'.'.join(path)} lacks its merge key "
                              f"'{merge_key}'")
        for i, existing in enumerate(current):
            if i not in used and existing.get(merge_key) == item[merge_key]:
                merged.append(strategic_merge(existing, item, where, path))
                used.add(i)
                break
        else:
            merged.append(copy.deepcopy(item))
    merged.extend(copy.deepcopy(e) for i, e in enumerate(current) if i not in used)
    return merged


def _generate_configmaps(entries, directory, where):
    out = []
    if not isinstance(entries, list):
        raise RenderError(f"{where}: configMapGenerator must be a list")
    for entry in entries:
        unknown = set(entry) - {"name", "files", "literals", "options"}
        if unknown:
            raise RenderError(f"{where}: configMapGenerator field(s) {sorted(unknown)} "
                              "are not supported")
        name = entry.get("name")
        if not name:
            raise RenderError(f"{where}: configMapGenerator entry without name")
        options = entry.get("options") or {}
        unknown = set(options) - {"disableNameSuffixHash", "labels", "annotations"}
        if unknown:
            raise RenderError(f"{where}: configMapGenerator '{name}' option(s) "
                              f"{sorted(unknown)} are not supported")
        if options.get("disableNameSuffixHash") is not True:
            raise RenderError(f"{where}: configMapGenerator '{name}' needs "
                              "options.disableNameSuffixHash: true (name hashing is not "
                              "implemented)")
        data = {}
        for spec in entry.get("files") or []:
            key, _, rel = spec.partition("=") if "=" in spec else (os.path.basename(spec), "",
                                                                   spec)
            path = os.path.join(directory, rel)
            if not _inside(directory, path):
                raise RenderError(f"{where}: configMapGenerator file '{rel}' is outside "
                                  f"{directory}")
            try:
                with open(path, encoding="utf-8") as f:
                    data[key] = f.read()
            except OSError as e:
                raise RenderError(f"{where}: configMapGenerator file '{rel}': {e}") from e
        for spec in entry.get("literals") or []:
            if "=" not in spec:
                raise RenderError(f"{where}: literal '{spec}' is not KEY=VALUE")
            key, _, value = spec.partition("=")
            data[key] = value
        meta = {"name": name}
        if options.get("labels"):
            meta["labels"] = dict(options["labels"])
        if options.get("annotations"):
            meta["annotations"] = dict(options["annotations"])
        out.append({"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data})
    return out


def _apply_patches(objects, patches, directory, where):
    if not isinstance(patches, list):
        raise RenderError(f"{where}: patches must be a list")
    for entry in patches:
        unknown = set(entry) - {"path", "patch"}
        if unknown:
            raise RenderError(f"{where}: patch field(s) {sorted(unknown)} are not supported "
                              "(only path or patch, matched by the patch's own kind and name)")
        if ("path" in entry) == ("patch" in entry):
            raise RenderError(f"{where}: a patch needs exactly one of path, patch")
        if "path" in entry:
            ppath = os.path.join(directory, entry["path"])
            if not _inside(directory, ppath):
                raise RenderError(f"{where}: patch '{entry['path']}' is outside {directory}")
            docs = _load_yaml_docs(ppath)
            label = ppath
        else:
            try:
                docs = [d for d in yaml.safe_load_all(entry["patch"]) if d is not None]
            except yaml.YAMLError as e:
                raise RenderError(f"{where}: inline patch: {e}") from e
            label = f"{where} (inline patch)"
        if len(docs) != 1 or not isinstance(docs[0], dict):
            raise RenderError(f"{label}: a strategic merge patch must be one mapping "
                              "(JSON 6902 patches are not supported)")
        patch = docs[0]
        _check_object(patch, label)
        pid = object_id(patch)
        matches = [i for i, o in enumerate(objects)
                   if object_id(o)[:2] == pid[:2] and o["metadata"]["name"] == pid[3]
                   and (not pid[2] or o["metadata"].get("namespace", "") == pid[2])]
        if len(matches) != 1:
            raise RenderError(f"{label}: patch for {_id_text(pid)} matches {len(matches)} "
                              "resources, expected 1")
        i = matches[0]
        patched = strategic_merge(objects[i], patch, label)
        if object_id(patched)[:2] != object_id(objects[i])[:2]:
            raise RenderError(f"{label}: a patch may not change apiVersion group or kind")
        objects[i] = patched


def _apply_namespace(objects, namespace, where):
    for obj in objects:
        if obj["kind"] in NAMESPACE_REFERENCING:
            raise RenderError(f"{where}: namespace with a {obj['kind']} is not supported "
                              "(kustomize rewrites its references)")
        if obj["kind"] not in CLUSTER_SCOPED:
            obj["metadata"]["namespace"] = namespace


def _apply_labels(objects, entries, where):
    if not isinstance(entries, list):
        raise RenderError(f"{where}: labels must be a list")
    for entry in entries:
        unknown = set(entry) - {"pairs", "includeSelectors", "includeTemplates"}
        if unknown:
            raise RenderError(f"{where}: labels field(s) {sorted(unknown)} are not supported")
        if entry.get("includeSelectors"):
            raise RenderError(f"{where}: labels with includeSelectors: true is not supported")
        pairs = entry.get("pairs") or {}
        for key, value in pairs.items():
            if not isinstance(value, str):
                raise RenderError(f"{where}: label {key} must be a string, got {value!r}")
        for obj in objects:
            obj["metadata"].setdefault("labels", {}).update(pairs)
            if entry.get("includeTemplates"):
                template = obj.get("spec", {}).get("template")
                if isinstance(template, dict):
                    template.setdefault("metadata", {}).setdefault("labels", {}).update(pairs)


def _split_image(image):
    """'reg/name:tag' -> ('reg/name', ':tag'); digests keep their '@'."""
    if "@" in image:
        name, _, digest = image.partition("@")
        return name, "@" + digest
    slash = image.rfind("/")
    colon = image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _walk_containers(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("containers", "initContainers", "ephemeralContainers") and isinstance(
                    value, list):
                for c in value:
                    if isinstance(c, dict):
                        yield c
            else:
                yield from _walk_containers(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk_containers(item)


def _apply_images(objects, entries, where):
    if not isinstance(entries, list):
        raise RenderError(f"{where}: images must be a list")
    for entry in entries:
        unknown = set(entry) - {"name", "newName", "newTag", "digest"}
        if unknown:
            raise RenderError(f"{where}: images field(s) {sorted(unknown)} are not supported")
        if not entry.get("name"):
            raise RenderError(f"{where}: images entry without name")
        if "newTag" in entry and "digest" in entry:
            raise RenderError(f"{where}: images entry '{entry['name']}' has both newTag and "
                              "digest")
        for obj in objects:
            for container in _walk_containers(obj.get("spec")):
                image = container.get("image")
                if not isinstance(image, str):
                    continue
                name, suffix = _split_image(image)
                if name != entry["name"]:
                    continue
                if "newTag" in entry:
                    suffix = ":" + str(entry["newTag"])
                elif "digest" in entry:
                    suffix = "@" + entry["digest"]
                container["image"] = entry.get("newName", name) + suffix


def render(directory, _stack=()):
    """Returns the list of objects the kustomization in `directory` produces."""
    directory = os.path.realpath(directory)
    if directory in _stack:
        raise RenderError(f"{directory}: kustomization cycle through {list(_stack)}")
    kfile = _find_kustomization(directory)
    docs = _load_yaml_docs(kfile)
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise RenderError(f"{kfile}: must hold one mapping")
    k = docs[0]
    unknown = set(k) - KNOWN_FIELDS
    if unknown:
        raise RenderError(f"{kfile}: unsupported field(s) {sorted(unknown)}")
    if k.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or k.get("kind") != (
            "Kustomization"):
        raise RenderError(f"{kfile}: expected apiVersion kustomize.config.k8s.io/v1beta1, "
                          "kind Kustomization")

    objects = []
    for res in k.get("resources") or []:
        if not isinstance(res, str) or "://" in res or res.startswith(("github.com", "git@")):
            raise RenderError(f"{kfile}: resource {res!r} is not a local path")
        path = os.path.join(directory, res)
        if os.path.isdir(path):
            objects.extend(render(path, _stack + (directory,)))
        elif os.path.isfile(path):
            if not _inside(directory, path):
                raise RenderError(f"{kfile}: resource file '{res}' is outside {directory}")
            for doc in _load_yaml_docs(path):
                _check_object(doc, path)
                objects.append(doc)
        else:
            raise RenderError(f"{kfile}: resource '{res}' does not exist")
    objects.extend(_generate_configmaps(k.get("configMapGenerator") or [], directory, kfile))

    if "patches" in k:
        _apply_patches(objects, k["patches"] or [], directory, kfile)
    if "namespace" in k:
        _apply_namespace(objects, k["namespace"], kfile)
    if "labels" in k:
        _apply_labels(objects, k["labels"] or [], kfile)
    if "images" in k:
        _apply_images(objects, k["images"] or [], kfile)

    seen = {}
    for obj in objects:
        oid = object_id(obj)
        if oid in seen:
            raise RenderError(f"{kfile}: {_id_text(oid)} is defined twice")
        seen[oid] = obj
    return objects


def main(argv):
    if len(argv) != 2:
        print("usage: kustomize_render.py DIR", file=sys.stderr)
        return 2
    try:
        objects = render(argv[1])
    except RenderError as e:
        print(f"kustomize_render: {e}", file=sys.stderr)
        return 1
    yaml.safe_dump_all(objects, sys.stdout, sort_keys=False, default_flow_style=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
