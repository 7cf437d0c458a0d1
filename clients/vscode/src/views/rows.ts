/** A tree view of core rows (src/core/tree.ts): one TreeItem per row, nothing decided here. */

import * as vscode from "vscode";

import type { Row } from "../core";

export class RowsProvider implements vscode.TreeDataProvider<Row> {
  private rows: Row[] = [];
  private readonly changed = new vscode.EventEmitter<Row | undefined>();
  readonly onDidChangeTreeData = this.changed.event;

  set(rows: Row[]): void {
    this.rows = rows;
    this.changed.fire(undefined);
  }

  getChildren(row?: Row): Row[] {
    return row ? row.children ?? [] : this.rows;
  }

  getTreeItem(row: Row): vscode.TreeItem {
    const state = row.children?.length
      ? (row.ref?.kind === "server" ? vscode.TreeItemCollapsibleState.Expanded : vscode.TreeItemCollapsibleState.Collapsed)
      : vscode.TreeItemCollapsibleState.None;
    const item = new vscode.TreeItem(row.label, state);
    item.id = row.id;
    item.description = row.description;
    item.tooltip = row.tooltip;
    item.contextValue = row.contextValue;
    if (row.icon) {
      item.iconPath = new vscode.ThemeIcon(row.icon);
    }
    return item;
  }

  dispose(): void {
    this.changed.dispose();
  }
}
